"""Development tools, never imported by the runtime: throwaway PostgreSQL/Redis servers
(`embedded`, needs the `embedded` extra), the worker-process harness (`harness`) and
`dispatcher demo` (`demo`, `demo_app`). Used by the tests, the bench suite and the demo."""
