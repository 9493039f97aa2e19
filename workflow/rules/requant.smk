rule requant:
    input:
        parent=rules.model.output.info,
        protocol=protocol_files("requant"),
    output:
        gate=f"{RESULTS}/requant/gate.parquet",
        checkpoints=directory(f"{RESULTS}/requant/checkpoints"),
        manifest=f"{RESULTS}/requant/manifest.json",
    params:
        code=code_digest("requant"),
        cfg=config_digest(config, ["model"]),
    log:
        f"{LOGS}/requant.log",
    benchmark:
        f"{BENCHMARKS}/requant.tsv"
    threads: workflow.cores
    resources:
        mem_mb=16000,
    shell:
        stage_cmd("requant", f"{RESULTS}/requant", "--input parent={input.parent}") + " 2> {log}"
