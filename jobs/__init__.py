"""What a user launches: the ``tidelake`` command line."""
