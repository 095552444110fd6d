"""Mutation runs: the operator broken on purpose, to show the tests named for a property catch it."""
