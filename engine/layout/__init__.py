"""The table's layout: file groups and slices, partition paths, key generation,
``hoodie.properties``."""
