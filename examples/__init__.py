"""Examples that read as in-tree slime examples; a package so env factories load by dotted path."""
