"""On-disk encodings: Avro codec and schemas, log format and blocks, base files, bloom
filters, file names."""
