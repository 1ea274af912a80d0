"""Real SGLang servers on GPUs: `server_args` builds one engine's ServerArgs fields and its
`sglang.launch_server` command from args (framework fields + the `--sglang-*` passthrough),
`engine` starts, health-checks and stops the server process, `router` runs sglang-router."""
