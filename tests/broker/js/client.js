// KafkaJS (the version package-lock.json pins) driven by tests/broker/test_kafkajs.py: one JSON
// command on stdin, one JSON answer on stdout; the Python test compares every field.
//
//   {"brokers": ["127.0.0.1:9092"], "sasl": {"username": .., "password": ..} or null,
//    "produce": {"topic", "codec": "none" | "gzip", "idempotent": bool,
//                "records": [{"partition", "key", "value", "headers": [[name, value]], "timestamp"}]},
//    "consume": {"topic", "partitions": {"0": count, ...}, "timeout_ms"},
//    "list": true,
//    "group": {"topic", "group", "count", "timeout_ms"}}
//
// Keys, values and header values are base64 (null: none); timestamps are milliseconds.
// Answer: {"produced": [{"partition", "offset"}] in record order,
//          "consumed": [{"partition", "offset", "timestamp", "key", "value", "headers"}],
//          "topics": [name, ...] (admin.listTopics: the topics the principal may describe),
//          "grouped": [records like "consumed"] (KafkaJS's consumer in group "group",
//                     subscribed from the beginning, until "count" records, committing each)},
// or {"error": {"name", "message", "type"}} with exit status 1 (a Kafka error's type is its
// Kafka name, such as TOPIC_AUTHORIZATION_FAILED; a failed SASL authentication's is
// SASL_AUTHENTICATION_FAILED).
//
// Consuming: KafkaJS has no consumer without a group (its consumer joins one), so "consume"
// reads through KafkaJS's own Fetch request and decoder, the ones its consumer uses: the
// cluster of a producer, asked for each partition's leader, then Fetch from offset 0 until
// each partition has the count asked for. "group" is KafkaJS's consumer itself.
'use strict'

const { Kafka, CompressionTypes, Partitioners, logLevel } = require('kafkajs')

const CODECS = { none: CompressionTypes.None, gzip: CompressionTypes.GZIP }

function b64 (text) {
  return text === null || text === undefined ? null : Buffer.from(text, 'base64')
}

function out (buffer) {
  return buffer === null || buffer === undefined ? null : Buffer.from(buffer).toString('base64')
}

function privateCreateCluster (kafka) {
  // Kafka's private cluster factory (a symbol-keyed method): the one its clients use
  for (const owner of [kafka, Object.getPrototypeOf(kafka)]) {
    for (const symbol of Object.getOwnPropertySymbols(owner)) {
      if (symbol.description === 'private:Kafka:createCluster') return owner[symbol].bind(kafka)
    }
  }
  throw new Error('KafkaJS has no private:Kafka:createCluster (another version than the lock pins?)')
}

async function produce (kafka, command) {
  const producer = kafka.producer({
    createPartitioner: Partitioners.DefaultPartitioner,
    idempotent: Boolean(command.idempotent),
    maxInFlightRequests: command.idempotent ? 1 : undefined,
    allowAutoTopicCreation: false,
    retry: { retries: 2 }
  })
  await producer.connect()
  try {
    const messages = command.records.map(r => ({
      partition: r.partition,
      key: b64(r.key),
      value: b64(r.value),
      timestamp: String(r.timestamp),
      headers: Object.fromEntries(r.headers.map(([name, value]) => [name, b64(value)]))
    }))
    const metadata = await producer.send({
      topic: command.topic,
      messages,
      acks: -1,
      timeout: 10000,
      compression: CODECS[command.codec]
    })
    // one batch per partition: a record's offset is its partition's base offset + its place
    const next = {}
    for (const m of metadata) next[m.partition] = Number(m.baseOffset)
    return command.records.map(r => ({ partition: r.partition, offset: next[r.partition]++ }))
  } finally {
    await producer.disconnect()
  }
}

async function consume (kafka, command) {
  const cluster = privateCreateCluster(kafka)({ allowAutoTopicCreation: false })
  await cluster.connect()
  try {
    await cluster.addTargetTopic(command.topic)
    await cluster.refreshMetadata()
    const wanted = Object.fromEntries(
      Object.entries(command.partitions).map(([p, count]) => [Number(p), count]))
    const next = Object.fromEntries(Object.keys(wanted).map(p => [p, 0]))
    const consumed = []
    const deadline = Date.now() + (command.timeout_ms || 10000)
    const left = () => Object.keys(wanted).filter(p => next[p] < wanted[p]).map(Number)
    while (left().length) {
      if (Date.now() > deadline) throw new Error(`timed out; still waiting for ${JSON.stringify(left())}`)
      const leaders = cluster.findLeaderForPartitions(command.topic, left())
      for (const [nodeId, partitions] of Object.entries(leaders)) {
        const broker = await cluster.findBroker({ nodeId })
        const response = await broker.fetch({
          maxWaitTime: 200,
          minBytes: 1,
          maxBytes: 1 << 20,
          topics: [{
            topic: command.topic,
            partitions: partitions.map(p => ({ partition: p, fetchOffset: String(next[p]), maxBytes: 1 << 20 }))
          }]
        })
        for (const topic of response.responses) {
          for (const part of topic.partitions) {
            if (part.errorCode) throw new Error(`Fetch error ${part.errorCode} on partition ${part.partition}`)
            for (const m of part.messages) {
              const offset = Number(m.offset)
              if (offset < next[part.partition]) continue // a batch starts before the fetch offset
              consumed.push({
                partition: part.partition,
                offset,
                timestamp: Number(m.timestamp),
                key: out(m.key),
                value: out(m.value),
                headers: Object.entries(m.headers || {}).map(([name, value]) => [name, out(value)])
              })
              next[part.partition] = offset + 1
            }
          }
        }
      }
    }
    return consumed
  } finally {
    await cluster.disconnect()
  }
}

async function group (kafka, command) {
  const consumer = kafka.consumer({
    groupId: command.group,
    sessionTimeout: 10000,
    heartbeatInterval: 500,
    // a fetch long-polls this long at the end of the log, and disconnect waits for the one in
    // flight (KafkaJS's default is 5 s)
    maxWaitTimeInMs: 200,
    allowAutoTopicCreation: false
  })
  await consumer.connect()
  const consumed = []
  try {
    await consumer.subscribe({ topic: command.topic, fromBeginning: true })
    await new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`timed out after ${consumed.length} of ${command.count} records`)),
        command.timeout_ms || 20000)
      consumer.run({
        autoCommit: true,
        autoCommitThreshold: 1, // each record committed once processed
        eachMessage: async ({ partition, message }) => {
          consumed.push({
            partition,
            offset: Number(message.offset),
            timestamp: Number(message.timestamp),
            key: out(message.key),
            value: out(message.value),
            headers: Object.entries(message.headers || {}).map(([name, value]) => [name, out(value)])
          })
          if (consumed.length >= command.count) {
            clearTimeout(timer)
            resolve()
          }
        }
      }).catch(reject)
    })
  } finally {
    await consumer.disconnect() // (commits what was processed, then leaves the group)
  }
  return consumed
}

async function main () {
  const chunks = []
  for await (const chunk of process.stdin) chunks.push(chunk)
  const command = JSON.parse(Buffer.concat(chunks).toString('utf8'))
  const kafka = new Kafka({
    clientId: 'eventlog-kafkajs-test',
    brokers: command.brokers,
    sasl: command.sasl ? { mechanism: 'plain', ...command.sasl } : undefined,
    connectionTimeout: 5000,
    requestTimeout: 10000,
    retry: { retries: 2, initialRetryTime: 100 },
    logLevel: logLevel.NOTHING
  })
  const answer = {}
  if (command.produce) answer.produced = await produce(kafka, command.produce)
  if (command.consume) answer.consumed = await consume(kafka, command.consume)
  if (command.group) answer.grouped = await group(kafka, command.group)
  if (command.list) {
    const admin = kafka.admin()
    await admin.connect()
    try {
      answer.topics = await admin.listTopics()
    } finally {
      await admin.disconnect()
    }
  }
  process.stdout.write(JSON.stringify(answer) + '\n')
}

function kafkaType (error) {
  // a retried error wraps the protocol error that ended the retries
  for (let e = error; e; e = e.cause || e.originalError) {
    if (e.type) return e.type
    if (e.name === 'KafkaJSSASLAuthenticationError') return 'SASL_AUTHENTICATION_FAILED'
  }
  return null
}

main().catch(error => {
  process.stdout.write(JSON.stringify({
    error: { name: error.name, message: error.message, type: kafkaType(error) }
  }) + '\n')
  process.exit(1)
})
