"""The one mapping from the engine's errors (and the policy's refusals) to Kafka's error codes,
as api/errors.py is the one mapping to problem+json.

The choice for each error is the code a Kafka client already handles the right way: retriable
where a retry can succeed (a shard restarting answers NOT_LEADER_OR_FOLLOWER, so the client
refreshes its metadata and retries, as after a leader change), fatal where it cannot.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from api.errors import ApiError
from engine import errors as e

logger = logging.getLogger("eventlog.kafka")

# most specific first: the first class an error is an instance of decides
_CODES: tuple[tuple[type[BaseException], ErrorCode], ...] = (
    (e.TopicDeletedError, ErrorCode.unknown_topic_or_partition),
    (e.TopicNotFoundError, ErrorCode.unknown_topic_or_partition),
    (e.PartitionNotFoundError, ErrorCode.unknown_topic_or_partition),
    (e.ShardUnavailableError, ErrorCode.not_leader_or_follower),
    (e.LogClosedError, ErrorCode.not_leader_or_follower),
    (e.PartitionOfflineError, ErrorCode.kafka_storage_error),
    (e.TransientStorageError, ErrorCode.kafka_storage_error),
    (e.StorageError, ErrorCode.kafka_storage_error),
    (e.OffsetOutOfRangeError, ErrorCode.offset_out_of_range),
    (e.OutOfOrderSequenceError, ErrorCode.out_of_order_sequence_number),
    (e.ProducerFencedError, ErrorCode.invalid_producer_epoch),
    (e.TransactionsUnsupportedError, ErrorCode.transactional_id_authorization_failed),
    (e.RecordTooLargeError, ErrorCode.message_too_large),
    (e.InflatedTooLargeError, ErrorCode.record_list_too_large),
    (e.InflateLimitError, ErrorCode.record_list_too_large),
    (e.CorruptBatchError, ErrorCode.corrupt_message),
    (e.KeyRequiredError, ErrorCode.invalid_record),
    (e.InvalidPartitionsError, ErrorCode.invalid_partitions),
    (e.TopicExistsError, ErrorCode.topic_already_exists),
    (e.InvalidTopicNameError, ErrorCode.invalid_topic_exception),
    (e.InvalidConfigError, ErrorCode.invalid_config),
    (e.OpenFilesLimitError, ErrorCode.policy_violation),
    (e.InvalidRequestError, ErrorCode.invalid_request),
)

# the policy's refusals (api/policy.py raises ApiError) by their stable code
_API_CODES = {
    "unauthorized": ErrorCode.sasl_authentication_failed,
    "forbidden": ErrorCode.topic_authorization_failed,
    "quota_exceeded": ErrorCode.throttling_quota_exceeded,
    "unavailable": ErrorCode.not_leader_or_follower,
}


def error_code(exc: BaseException, what: str = "") -> ErrorCode:
    """Kafka's error code for `exc`; anything unexpected is logged and is UNKNOWN_SERVER_ERROR."""
    if isinstance(exc, KafkaError):
        return exc.code
    if isinstance(exc, e.TransactionsUnsupportedError):
        # a batch marked transactional: Kafka answers a producer that skipped
        # InitProducerId with a transactional id this way
        return ErrorCode.invalid_txn_state
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    if isinstance(exc, ApiError):
        return _API_CODES.get(exc.code, ErrorCode.unknown_server_error)
    logger.error("kafka %s failed", what or "request", exc_info=exc)
    return ErrorCode.unknown_server_error


def change_error_code(exc: BaseException, what: str = "") -> ErrorCode:
    """Kafka's error code for a failed topic change (CreateTopics, DeleteTopics,
    CreatePartitions, AlterConfigs): as error_code(), but a controller that cannot be reached
    (shard 0 of a family restarting: ShardUnavailableError) or a broker stopping
    (LogClosedError) is NOT_CONTROLLER, the retriable code admin clients answer by finding the
    controller again and retrying (a topic deleted meanwhile stays UNKNOWN_TOPIC_OR_PARTITION)."""
    if isinstance(exc, (e.ShardUnavailableError, e.LogClosedError)) and not isinstance(
        exc, e.TopicDeletedError
    ):
        return ErrorCode.not_controller
    return error_code(exc, what)


def message_of(exc: BaseException) -> str:
    """The text a response's error_message field carries (where the version has one)."""
    return str(exc) if not isinstance(exc, KafkaError) else exc.message


class KafkaError(Exception):
    """An error a handler answers with a Kafka code of its own choosing."""

    def __init__(self, code: ErrorCode, message: str = "") -> None:
        super().__init__(message or code.name)
        self.code = code
        self.message = message or code.name
