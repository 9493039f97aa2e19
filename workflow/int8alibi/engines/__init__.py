"""Generation and scoring engines: the project's W8A8 engine, the vLLM backend, the identity contract."""
