"""Python hooks for kernel types whose slots need logic (named by a definition's `hook:`)."""
