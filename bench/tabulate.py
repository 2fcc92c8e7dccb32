#!/usr/bin/env python3
"""Markdown tables (medians over repetitions) from gemm_bench JSON output.

    gemm_bench --benchmark_repetitions=5 --benchmark_out=run.json \
               --benchmark_out_format=json ...
    bench/tabulate.py run1.json run2.json ... > tables.md

A benchmark present in several files (repeated runs of the same command) gets
the median over the files of its per-run medians.
"""
import json
import sys


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def load(paths):
    """Per benchmark: the median aggregate of each file; if several files hold
    the same benchmark (repeated runs), the median over files of every number."""
    meds, cvs, ctx = {}, {}, {}
    for p in paths:
        with open(p) as fh:
            d = json.load(fh)
        ctx.update(d.get("context", {}))
        ctx.setdefault("load_avgs", []).append(d.get("context", {}).get("load_avg"))
        file_meds, singles = {}, {}
        for b in d["benchmarks"]:
            name = b["run_name"].replace("/real_time", "")
            if b.get("run_type") != "aggregate":
                singles.setdefault(name, b)  # used when run without repetitions
            elif b["aggregate_name"] == "median":
                file_meds.setdefault(name, []).append(b)  # a name may be registered twice
            elif b["aggregate_name"] == "cv":
                cvs.setdefault(name, []).append(b)
        for name, b in singles.items():
            file_meds.setdefault(name, [b])
        for name, bs in file_meds.items():
            meds.setdefault(name, []).extend(bs)

    def combine(runs):
        out = dict(runs[-1])
        out["runs"] = len(runs)
        for k, v in runs[-1].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
                out[k] = median(vals)
        return out

    med = {n: combine(r) for n, r in meds.items()}
    cv = {n: combine(r) for n, r in cvs.items()}
    return med, cv, ctx


def f(v, nd=1):
    return "–" if v is None else f"{v:.{nd}f}"


def get(med, name, key):
    b = med.get(name)
    if b is None or b.get("error_occurred"):
        return None
    return b.get(key)


def drop_empty_sections(text):
    """Removes '### ...' sections whose tables have no data rows."""
    parts = text.split("\n### ")
    kept = [parts[0]]
    for sec in parts[1:]:
        rows = [l for l in sec.splitlines() if l.startswith("|") and not l.startswith("|---")]
        if len(rows) > 1:
            kept.append(sec)
    return "\n### ".join(kept)


def main():
    med, cv, ctx = load(sys.argv[1:])
    out = []
    w = out.append
    w(f"Context: {ctx.get('host_name', '?')}, {ctx.get('num_cpus', '?')} CPUs @ "
      f"{ctx.get('mhz_per_cpu', '?')} MHz (nominal), 1/5/15-min load averages at the start of each "
      f"file: {'; '.join('/'.join(f'{x:.1f}' for x in l) for l in ctx.get('load_avgs', []) if l)}, tilejit active ISA {ctx.get('tilejit_active_isa', '?')}, "
      f"oneDNN {ctx.get('onednn', '?')}.\n")

    # Peak.
    w("### Peak (JIT probe, register-only dot products)\n")
    w("| bench | threads | GFLOP/s (wall) | GFLOP/s (cpu) | per-core peak used for % | "
      "% of threads × peak (wall) |")
    w("|---|---|---|---|---|---|")
    for isa in ("BM_PeakAvx512Bf16", "BM_PeakAmxBf16"):
        for t in (1, 2):
            n = f"{isa}/{t}"
            if n not in med:
                continue
            if med[n].get("error_occurred"):
                w(f"| {isa} | {t} | skipped: {med[n].get('error_message', '')} | | | |")
                continue
            w(f"| {isa} | {t} | {f(get(med, n, 'GFLOPs'))} | {f(get(med, n, 'GFLOPs_cpu'))} | "
              f"{f(get(med, n, 'peak_per_core'))} | {f(get(med, n, 'pct_peak'))} |")
    w("")

    # DRAM.
    w("### DRAM read bandwidth (streaming AVX-512 sum over 2 GiB)\n")
    w("| threads | pages | GB/s (wall) | GB/s (cpu) | time cv |")
    w("|---|---|---|---|---|")
    for huge in (1, 0):
        for t in (1, 2):
            n = f"BM_DramReadBandwidth/threads:{t}/hugepages:{huge}"
            if n in med:
                c = cv.get(n, {}).get("real_time")
                w(f"| {t} | {'2 MiB (THP)' if huge else '4 KiB'} | {f(get(med, n, 'GBs'))} | "
                  f"{f(get(med, n, 'GBs_cpu'))} | {f(c * 100 if c is not None else None)}% |")
    w("")

    shapes = [(4096, 4096), (11008, 4096), (4096, 11008)]
    ms = [1, 4, 16, 64, 256, 1024]

    for th in (1, 2):
        w(f"### Hot GEMM, {th} thread{'s' if th > 1 else ''}\n")
        w("| M | N | K | tilejit GFLOP/s | oneDNN GFLOP/s | ratio | % peak | tilejit GFLOP/s (cpu) | "
          "oneDNN GFLOP/s (cpu) | ratio (cpu) | % peak (cpu) | time cv tilejit / oneDNN |")
        w("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for n_, k_ in shapes:
            for m in ms:
                t = f"BM_TilejitGemm/{m}/{n_}/{k_}/{th}"
                o = f"BM_OnednnMatmul/{m}/{n_}/{k_}/{th}"
                if t not in med:
                    continue
                ct = cv.get(t, {}).get("real_time")
                co = cv.get(o, {}).get("real_time")
                w(f"| {m} | {n_} | {k_} | {f(get(med, t, 'GFLOPs'))} | {f(get(med, o, 'GFLOPs'))} | "
                  f"{f(get(med, t, 'vs_onednn'), 2)} | {f(get(med, t, 'pct_peak'))} | "
                  f"{f(get(med, t, 'GFLOPs_cpu'))} | {f(get(med, o, 'GFLOPs_cpu'))} | "
                  f"{f(get(med, t, 'vs_onednn_cpu'), 2)} | {f(get(med, t, 'pct_peak_cpu'))} | "
                  f"{f(ct * 100 if ct is not None else None, 0)}% / "
                  f"{f(co * 100 if co is not None else None, 0)}% |")
        w("")

    # Decode sweep around the L3 size.
    w("### Hot decode (M=1, N=4096) across weight sizes around the 32 MiB L3\n")
    w("At M=1, GFLOP/s equals GB/s of bf16 weights read.\n")
    w("| K | weights MiB | threads | tilejit GB/s | oneDNN GB/s | ratio | tilejit GB/s (cpu) | "
      "oneDNN GB/s (cpu) | ratio (cpu) |")
    w("|---|---|---|---|---|---|---|---|---|")
    for k_ in (1024, 2048, 4096, 8192):
        for th in (1, 2):
            t = f"BM_TilejitGemmDecodeSweep/1/4096/{k_}/{th}"
            o = f"BM_OnednnMatmulDecodeSweep/1/4096/{k_}/{th}"
            if t not in med:
                continue
            # Quotients of the columns shown: K=4096 shares its key (and the
            # process's oneDNN rate log) with BM_OnednnMatmul/1/4096/4096/T.
            def q(a, b):
                return a / b if a is not None and b else None
            tw, ow = get(med, t, 'GFLOPs'), get(med, o, 'GFLOPs')
            tc, oc = get(med, t, 'GFLOPs_cpu'), get(med, o, 'GFLOPs_cpu')
            w(f"| {k_} | {4096 * k_ * 2 // 2**20} | {th} | {f(tw)} | {f(ow)} | {f(q(tw, ow), 2)} | "
              f"{f(tc)} | {f(oc)} | {f(q(tc, oc), 2)} |")
    w("")

    # Cold decode.
    w("### Decode with cold weights (> 1 GiB of weight copies, a different one each call)\n")
    w("% DRAM: against the streaming read measured right before each run, over huge pages "
      "(the machine's ceiling) / over 4 KiB pages (what a malloc'd buffer gets).\n")
    w("| M | N | K | threads | tilejit GB/s (wall) | % DRAM 2M / 4K | oneDNN GB/s (wall) | "
      "% DRAM 2M / 4K | tilejit GB/s (cpu) | % DRAM 2M / 4K (cpu) | oneDNN GB/s (cpu) | "
      "% DRAM 2M / 4K (cpu) | tilejit GFLOP/s (cpu) | DRAM 2M / 4K GB/s (cpu) |")
    w("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n_, k_ in shapes:
        for m in (1, 16):
            for th in (1, 2):
                t = f"BM_TilejitGemmColdWeights/{m}/{n_}/{k_}/{th}"
                o = f"BM_OnednnMatmulColdWeights/{m}/{n_}/{k_}/{th}"
                if t not in med and o not in med:
                    continue
                gc = get(med, t, 'GBs_cpu')

                def pp(b, sfx=""):
                    return (f"{f(get(med, b, 'pct_dram_bw' + sfx), 0)} / "
                            f"{f(get(med, b, 'pct_dram_bw_4k' + sfx), 0)}")
                w(f"| {m} | {n_} | {k_} | {th} | {f(get(med, t, 'GBs'))} | {pp(t)} | "
                  f"{f(get(med, o, 'GBs'))} | {pp(o)} | {f(gc)} | {pp(t, '_cpu')} | "
                  f"{f(get(med, o, 'GBs_cpu'))} | {pp(o, '_cpu')} | "
                  f"{f(gc * m if gc is not None else None)} | "
                  f"{f(get(med, t, 'dram_GBs_cpu'))} / {f(get(med, t, 'dram4k_GBs_cpu'))} |")
    w("")

    # Page-size experiment.
    w("### Cold M=1 decode, 4 KiB vs 2 MiB pages (BM_RawDecodeColdPages, 1 thread)\n")
    w("The library's M=1 micro-kernel over N=K=4096, > 1 GiB of copies of the packed bytes in one "
      "mapping with or without transparent huge pages.\n")
    w("| pages | GB/s (wall) | GB/s (cpu) | % DRAM 2M (wall) | DRAM 2M / 4K GB/s (wall) |")
    w("|---|---|---|---|---|")
    for huge in (0, 1):
        n = f"BM_RawDecodeColdPages/hugepages:{huge}"
        if n in med:
            w(f"| {'2 MiB (THP)' if huge else '4 KiB'} | {f(get(med, n, 'GBs'))} | "
              f"{f(get(med, n, 'GBs_cpu'))} | {f(get(med, n, 'pct_dram_bw'), 0)} | "
              f"{f(get(med, n, 'dram_GBs'))} / {f(get(med, n, 'dram4k_GBs'))} |")
    w("")

    # Micro-kernel.
    w("### Micro-kernel by row count (BM_BrgemmMicrokernel: nr=64, whole K, B panel warm, 1 thread)\n")
    w("| mr | K | GFLOP/s (cpu) | % peak (cpu) | kernel |")
    w("|---|---|---|---|---|")
    for k_ in (4096, 11008):
        for mr in range(1, 13):
            n = f"BM_BrgemmMicrokernel/{mr}/{k_}"
            if n in med and not med[n].get("error_occurred"):
                w(f"| {mr} | {k_} | {f(get(med, n, 'GFLOPs_cpu'))} | {f(get(med, n, 'pct_peak_cpu'))} | "
                  f"{med[n].get('label', '')} |")
    w("")

    # Compile.
    w("### Compile time\n")
    w("| bench | µs wall (median) | µs CPU (median) | detail |")
    w("|---|---|---|---|")
    for name, b in med.items():
        if name.startswith(("BM_JitCompileMicrokernel", "BM_GemmFirstCall", "BM_OnednnPrimitiveCreate")):
            if b.get("error_occurred"):
                w(f"| {name} | skipped | | {b.get('error_message', '')} |")
                continue
            detail = b.get("label", "")
            if "code_bytes" in b:
                detail += f" ({int(b['code_bytes'])} code bytes)"
            if "lib_compile_us" in b:
                detail += (f"compiles/call {b['compiles_per_call']:.2f}, library's own emit+publish "
                           f"time {b['lib_compile_us']:.1f} µs")
            w(f"| {name} | {f(b['real_time'])} | {f(b['cpu_time'])} | {detail} |")
    w("")

    # Cache hit.
    w("### Cache-hit call overhead (M=1, N=16, K=32)\n")
    w("| bench | ns wall (median) | ns CPU (median) | detail |")
    w("|---|---|---|---|")
    for name, b in med.items():
        if name.startswith(("BM_CacheHitOverhead", "BM_RawMicrokernel")):
            detail = b.get("label", "")
            if "hits_per_call" in b:
                detail = f"cache hits/call {b['hits_per_call']:.2f}, compiles {b['compiles']:.0f}"
            w(f"| {name} | {f(b['real_time'])} | {f(b['cpu_time'])} | {detail} |")
    print(drop_empty_sections("\n".join(out)))


if __name__ == "__main__":
    main()
