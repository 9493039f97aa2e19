rule ksweep:
    input:
        protocol=protocol_files("ksweep"),
    output:
        counts=update(f"{RESULTS}/ksweep/counts.parquet"),
        ulp=update(f"{RESULTS}/ksweep/ulp.parquet"),
        fits=update(f"{RESULTS}/ksweep/fits.parquet"),
        summary=update(f"{RESULTS}/ksweep/summary.parquet"),
        evidence=update(f"{RESULTS}/ksweep/evidence.parquet"),
        manifest=update(f"{RESULTS}/ksweep/manifest.json"),
    log:
        f"{LOGS}/ksweep.log",
    benchmark:
        f"{BENCHMARKS}/ksweep.tsv"
    conda:
        software_env(gpu_capable=True)
    threads: stage_threads("ksweep")
    resources:
        mem_mb=RESOURCES["ksweep"].mem_mb,
        runtime=RESOURCES["ksweep"].runtime,
        gpu=1,
        gpu_mem_mb=RESOURCES["ksweep"].gpu_mem_mb,
    params:
        **stage_params("ksweep"),
    shell:
        stage_cmd("ksweep", f"{RESULTS}/ksweep") + " 2> {log:q}"
