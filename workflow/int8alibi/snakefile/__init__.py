"""What the Snakefile calls while it parses: the checked config and run plan, the rerun params, the
quoted commands. Above the domain (it reads the code digests, the environment and the venv stamps);
planning's decisions (resolve, resources, stage needs) are ``int8alibi.planning``'s."""
