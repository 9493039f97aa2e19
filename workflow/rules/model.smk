rule model:
    # The saved bf16 parent lives in results/model/parent/; it is not declared as a directory
    # output (Snakemake would add a timestamp file to it): parent.parquet lists and hashes every
    # file in it, and readers refuse a folder that differs.
    output:
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
