rule ksweep:
    input:
        protocol=protocol_files("ksweep"),
    output:
        counts=f"{RESULTS}/ksweep/counts.parquet",
        ulp=f"{RESULTS}/ksweep/ulp.parquet",
        fits=f"{RESULTS}/ksweep/fits.parquet",
        summary=f"{RESULTS}/ksweep/summary.parquet",
        evidence=f"{RESULTS}/ksweep/evidence.parquet",
        manifest=f"{RESULTS}/ksweep/manifest.json",
    params:
        code=code_digest("ksweep"),
        env=ENVIRONMENT,
    log:
        f"{LOGS}/ksweep.log",
    benchmark:
        f"{BENCHMARKS}/ksweep.tsv"
    threads: 2
    resources:
        mem_mb=8000,
        gpu=1,
    conda:
        software_env(gpu_capable=True)
    shell:
        stage_cmd("ksweep", f"{RESULTS}/ksweep") + " 2> {log:q}"
