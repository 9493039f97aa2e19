rule model:
    output:
        parent=directory(f"{RESULTS}/model/parent"),
        info=f"{RESULTS}/model/parent.parquet",
        manifest=f"{RESULTS}/model/manifest.json",
    params:
        code=code_digest("model"),
        cfg=config_digest(config, ["model"]),
    log:
        f"{LOGS}/model.log",
    benchmark:
        f"{BENCHMARKS}/model.tsv"
    threads: workflow.cores
    resources:
        mem_mb=16000,
    shell:
        stage_cmd("model", f"{RESULTS}/model") + " 2> {log}"
