"""Tests of the ingest package (a package, so test module names may repeat other folders')."""
