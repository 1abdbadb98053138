"""Reports: long work in lease mode, with a resolver for crash recovery."""
