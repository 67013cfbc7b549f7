"""Built-in environments: each domain's data, schema and plain (non-transactional) tools."""
