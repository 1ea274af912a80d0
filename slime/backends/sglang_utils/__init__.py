"""Real SGLang servers on GPUs: `server_args` builds one engine's ServerArgs fields and its
launch command from args (framework fields + the `--sglang-*` passthrough), `engine` starts,
health-checks and stops the server process, `router` runs sglang-router; `sglang_main` and
`router_main` are their launchers, which take the job's key from the environment, never argv."""
