"""The wrapper kinds: how a hooked function is wrapped, named once. The target table's rows and users' hook
files name them; ``hooks/wrappers.py`` builds the wrapper of each."""

SYNC = "sync"
COROUTINE = "coroutine"
ASYNC_GENERATOR = "async_generator"
FUTURE = "future"
#: Timers: the wrapper itself reads the clock around the call and hands the handler the duration
#: (``Handler.timed``) — the cheapest shape for the most common hook. Failed calls are not timed.
SYNC_TIMER = "sync_timer"
COROUTINE_TIMER = "coroutine_timer"
#: Not a wrapper: makes a Future subclass deliver its completions to FUTURE handlers itself (see
#: ``hook_future_class``), so that a FUTURE hook on a call returning such futures costs an attribute
#: store instead of a done-callback per call.
FUTURE_CLASS = "future_class"
#: Not a wrapper: a module-level factory replaced by the handler's own ``install(module)`` (vLLM's
#: ``vllm.v1.utils._PROFILER_FUNC``, which ``record_function_or_nullcontext`` calls for every scope).
SCOPE_FACTORY = "scope_factory"
#: A coroutine that may return an async generator (a streaming HTTP response): awaited, then, when
#: the result is an async generator, handed back inside a delegating async generator that ends the
#: measurement when the stream ends (``after`` / ``error`` as for ASYNC_GENERATOR); any other result
#: goes to ``after``.
COROUTINE_STREAM = "coroutine_stream"
