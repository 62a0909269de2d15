"""Kafka's wire protocol beside HTTP: each server process (each shard) is a Kafka broker."""
