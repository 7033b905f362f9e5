"""Hudi index implementations: how a record key is mapped to a file group."""
