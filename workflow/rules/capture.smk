checkpoint capture:
    input:
        gate=rules.requant.output.gate,
        protocol=protocol_files("capture"),
    output:
        index=f"{RESULTS}/capture/index.parquet",
        operands=directory(f"{RESULTS}/capture/operands"),
        manifest=f"{RESULTS}/capture/manifest.json",
    params:
        code=code_digest("capture"),
        cfg=config_digest(config, ["model", "size_profile", "corpus", "device", "arms"]),
    log:
        f"{LOGS}/capture.log",
    benchmark:
        f"{BENCHMARKS}/capture.tsv"
    threads: workflow.cores
    resources:
        mem_mb=16000,
        gpu=use_gpu(config),
    shell:
        stage_cmd("capture", f"{RESULTS}/capture", "--input gate={input.gate}") + " 2> {log}"
