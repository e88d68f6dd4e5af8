"""Hooks: the mechanism of wrapping a function — the handler protocol and how failures are reported, the
wrapper of each kind and its code generation, future completion hooking, patch records. Depends on nothing
above the facts; the target table (``targets``) says what to wrap, ``wiring`` does it."""
