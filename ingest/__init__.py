"""Structured Streaming ingestion: Kafka source, decoders, sink, global state index."""
