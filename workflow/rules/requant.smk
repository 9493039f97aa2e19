rule requant:
    input:
        parent=rules.model.output.info,
        model_manifest=rules.model.output.manifest,
        protocol=protocol_files("requant"),
        # the gate's reference: llm-compressor's own checkpoint of the parent, made in the run, unless
        # the config names a committed checkpoint (then that one, and reference_checkpoint never runs)
        reference=[] if RUN["model"].get("checkpoint") else rules.reference_checkpoint.output.manifest,
    # Tensor folders beside the tables are listed and hashed by the manifest, declared only for
    # --delete-all-output (deleted_with in common.smk says why).
    output:
        **stage_outputs("requant"),
    log:
        f"{LOGS}/requant.log",
    benchmark:
        f"{BENCHMARKS}/requant.tsv"
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("requant")
    resources:
        **stage_resources("requant"),
    params:
        # a committed checkpoint's files by name, size and content (requant is the stage that reads them)
        **stage_params("requant"),
        reference=(
            [] if RUN["model"].get("checkpoint") else ["--input", f"reference={stage_file('reference', 'manifest')}"]
        ),
    shell:
        stage_cmd("requant", f"{RESULTS}/requant", "--input parent={input.parent} {params.reference}") + " 2> {log:q}"
