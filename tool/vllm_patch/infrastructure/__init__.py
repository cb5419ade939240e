"""Journal and lock for every write, downloads and the cache, private git indexes."""
