"""The typed config: schema, composing the tree, validation (both processes read it)."""
