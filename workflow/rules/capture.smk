checkpoint capture:
    input:
        gate=rules.requant.output.gate,
        requant_manifest=rules.requant.output.manifest,
        protocol=protocol_files("capture"),
    # Tensor folders beside the tables are listed and hashed by the manifest, declared only for
    # --delete-all-output (deleted_with in common.smk says why).
    output:
        **deleted_with(operands=f"{RESULTS}/capture/operands"),
        index=update(f"{RESULTS}/capture/index.parquet"),
        manifest=update(f"{RESULTS}/capture/manifest.json"),
    log:
        f"{LOGS}/capture.log",
    benchmark:
        f"{BENCHMARKS}/capture.tsv"
    priority: rule_priority("capture")
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("capture")
    resources:
        mem_mb=RESOURCES["capture"].mem_mb,
        runtime=RESOURCES["capture"].runtime,
        gpu=use_gpu(RUN),
        gpu_mem_mb=RESOURCES["capture"].gpu_mem_mb,
    params:
        **stage_params("capture"),
    shell:
        stage_cmd("capture", f"{RESULTS}/capture", "--input gate={input.gate}") + " 2> {log:q}"
