//! Every experiment file parses and runs in `--quick` mode at a tiny size, in `sim` (where a
//! run costs a fraction of a second of wall time), and writes the JSON its contract names.

use dtx::cli::experiment::{experiment, experiments_dir, load_all, DirArg, ExperimentCmd, RunArgs};
use dtx_report::experiment::ExperimentReport;

#[test]
fn every_experiment_runs_quick_and_tiny_in_sim() {
    let dir = experiments_dir(None).expect("the checkout's experiments folder");
    let all = load_all(&dir).expect("every experiment file parses");
    assert!(all.len() >= 7, "the converted figures are experiments: {}", all.len());
    let out = tempfile::tempdir().unwrap();
    for (i, e) in all.iter().enumerate() {
        // Repeats are the same machinery for every experiment: the first runs two, the rest one
        // (two each doubled the suite's longest test).
        let repeat: u32 = if i == 0 { 2 } else { 1 };
        let sweeps_runtime = e.sweep.as_ref().is_some_and(|s| s.param == "runtime");
        let folder = out.path().join(&e.name);
        // A sweep over the hot keys needs as many keys as its points name, and no more.
        let hot_keys_swept = e
            .sweep
            .as_ref()
            .filter(|s| s.param == "hot-keys")
            .map(|s| s.values.iter().filter_map(|v| v.as_u64()).max().unwrap_or(0));
        let mut set = ["duration=0.1", "warmup=0.02"].map(String::from).to_vec();
        set.push(format!("keys={}", hot_keys_swept.map_or(2000, |most| (2 * most).max(2000))));
        let sweeps_hot_keys = hot_keys_swept.is_some();
        if e.bench.get("workload").map(String::as_str) == Some("tpcc") {
            // Loading the paper's warehouses is most of such a run in a debug build.
            set.push("warehouses=4".into());
        }
        if e.bench.contains_key("hot-keys") && !sweeps_hot_keys {
            set.push("hot-keys=100".into()); // Below the tiny key count.
        }
        // Thousands of clients in flight (slog-mh-sweep's 1,000 per worker) make a tiny run cost
        // minutes in a debug build; a few dozen exercise the same paths.
        let inflight = e.quick.get("inflight").or(e.bench.get("inflight")).and_then(|n| n.parse::<u32>().ok());
        if inflight.is_some_and(|n| n > 16) && e.sweep.as_ref().is_none_or(|s| s.param != "inflight") {
            set.push("inflight=16".into());
        }
        if let Some(faults) = e.bench.get("fault-at") {
            // A fault at the paper's moment lies past a tiny run's end: the same faults, early.
            let early: Vec<String> =
                faults.split(';').map(|f| format!("{}@50ms", f.split('@').next().unwrap())).collect();
            set.push(format!("fault-at={}", early.join(";")));
        }
        let args = RunArgs {
            name: Some(e.name.clone()),
            all: false,
            quick: true,
            repeat,
            // sim-calibration compares local with sim: it keeps both.
            runtime: (!sweeps_runtime).then(|| "sim".to_string()),
            set,
            json: None,
            out: Some(folder.clone()),
            jobs: None,
            dir: DirArg { dir: Some(dir.clone()) },
        };
        let ok = experiment(ExperimentCmd::Run(args), "test").unwrap_or_else(|err| panic!("{}: {err:#}", e.name));
        assert!(ok, "{}: a run failed", e.name);
        let r = ExperimentReport::read(&folder.join("experiment.json")).unwrap();
        assert_eq!(r.experiment, e.name);
        assert_eq!(r.claims.len(), e.claims.len(), "{}: a verdict per claim", e.name);
        let points = e.points(true).len();
        assert_eq!(
            r.runs.len(),
            points * e.protocols.len() * repeat as usize,
            "{}: every point, protocol and repeat",
            e.name
        );
        for run in &r.runs {
            assert!(e.protocols.contains(&run.protocol), "{}: run of {}", e.name, run.protocol);
            assert!(run.params.contains_key("experiment.point") && run.params.contains_key("experiment.repeat"));
            if let Some(s) = &e.sweep {
                assert!(run.params.contains_key(&s.param), "{}: the point under {}", e.name, s.param);
            }
        }
        assert!(folder.join("experiment.svg").is_file());
    }
}

/// `--json FILE` from a folder without `results/`: the run's results folder (its plot and its
/// JSON) is made too, so that a finished run is never lost at the end (it once failed writing
/// the SVG) and the report finds it (it once held only the SVG).
#[test]
fn json_elsewhere_from_a_folder_without_results() {
    let cwd = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dtx"))
        .current_dir(cwd.path())
        .env_remove("DTX_EXPERIMENTS")
        .args(["experiment", "run", "message-counts", "--quick", "--json", "e.json"])
        .args(["--set", "duration=0.05", "--set", "warmup=0.01"])
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    let r = ExperimentReport::read(&cwd.path().join("e.json")).unwrap();
    assert_eq!(r.experiment, "message-counts");
    let results: Vec<_> = std::fs::read_dir(cwd.path().join("results")).unwrap().flatten().map(|e| e.path()).collect();
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].join("experiment.svg").is_file(), "{text}");
    // The results folder holds the JSON too, so `dtx experiment report` finds the run.
    assert!(results[0].join("experiment.json").is_file(), "{text}");
    let report = std::process::Command::new(env!("CARGO_BIN_EXE_dtx"))
        .current_dir(cwd.path())
        .args(["experiment", "report", "--out", "report.html"])
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&report.stdout), String::from_utf8_lossy(&report.stderr));
    assert!(report.status.success() && said.contains("(1 experiments)"), "{said}");
}

/// Simulated runs side by side (`--jobs 2`) measure exactly what they measure one at a time,
/// and come back in the jobs' order; `--jobs 0` is refused by name.
#[test]
fn simulated_runs_side_by_side_measure_what_they_do_alone() {
    let cwd = tempfile::tempdir().unwrap();
    let run = |jobs: &str| {
        let json = format!("jobs-{jobs}.json");
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dtx"))
            .current_dir(cwd.path())
            .env_remove("DTX_EXPERIMENTS")
            .args(["experiment", "run", "message-counts", "--quick", "--jobs", jobs, "--json", &json])
            .args(["--set", "duration=0.05", "--set", "warmup=0.01"])
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text, cwd.path().join(json))
    };
    let figures = |path: &std::path::Path| {
        let r = ExperimentReport::read(path).unwrap();
        r.runs.iter().map(|run| (run.protocol.clone(), run.committed, run.aborted)).collect::<Vec<_>>()
    };
    let ((ok1, text1, one), (ok2, text2, two)) = (run("1"), run("2"));
    assert!(ok1 && ok2, "{text1}\n{text2}");
    let alone = figures(&one);
    assert!(alone.len() > 1 && alone.iter().all(|r| r.1 > 0), "{alone:?}");
    assert_eq!(alone, figures(&two));
    let (ok, text, _) = run("0");
    assert!(!ok && text.contains("--jobs 0"), "{text}");
}

/// Writes `files` into a fresh folder; returns it.
fn folder_with(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).unwrap();
    }
    dir
}

const HEAD: &str = r#"
title = "t"
paper = "dtx"
figure = "f"
measures = "m"
takes = { full_s = 1, quick_s = 1 }
"#;

/// Sweeping an option a protocol lacks is one line naming the protocol and the option, and
/// listing its options, before anything runs.
#[test]
fn an_option_sweep_over_a_protocol_without_it_is_refused_at_once() {
    let text = format!(
        "name = \"bad\"\nprotocols = [\"2pl-waitdie\", \"occ\"]\n{HEAD}\n[bench]\nruntime = \"sim\"\n\
         [sweep]\noption = \"lock_wait_us\"\nvalues = [50, 500]\n"
    );
    let dir = folder_with(&[("bad.toml", &text)]);
    let err = format!("{:#}", load_all(dir.path()).unwrap_err());
    assert!(!err.contains('\n'), "one line: {err}");
    assert!(err.contains("`occ`") && err.contains("lock_wait_us") && err.contains("its options"), "{err}");
    assert!(err.contains("bad.toml") && err.contains("[sweep] option"), "{err}");
}

/// A latency matrix named in an experiment file is found beside the file, whatever the
/// current folder; with regions, each run reports latency per region and per class.
#[test]
fn a_latency_matrix_is_relative_to_its_file_and_latency_comes_per_region() {
    let text = format!(
        "name = \"wan\"\nprotocols = [\"occ\", \"2pl-nowait\"]\n{HEAD}\n[bench]\nruntime = \"sim\"\nnodes = 2\n\
         latency-matrix = \"wan.txt\"\nregions = \"0,1\"\ndistributed = 0.5\nkeys = 2000\nduration = \"0.1\"\n\
         warmup = \"0.02\"\n[bench.protocol.\"2pl-nowait\"]\ndistributed = 0.0\n\
         [[claim]]\ntext = \"distributed transactions wait for the WAN\"\nkind = \"value\"\n\
         metric = \"latency.class.distributed.p50 / latency.class.single-node.p50\"\nof = \"occ\"\nband = [10, inf]\n"
    );
    let dir = folder_with(&[("wan.toml", &text), ("wan.txt", "0 100us\n2ms 0\n")]);
    let out = dir.path().join("out");
    let args = RunArgs {
        name: Some("wan".into()),
        all: false,
        quick: false,
        repeat: 1,
        runtime: None,
        set: Vec::new(),
        json: None,
        out: Some(out.clone()),
        jobs: None,
        dir: DirArg { dir: Some(dir.path().to_path_buf()) },
    };
    assert!(experiment(ExperimentCmd::Run(args), "test").unwrap());
    let r = ExperimentReport::read(&out.join("experiment.json")).unwrap();
    for run in &r.runs {
        assert_eq!(run.latency_us_by_region.len(), 2, "{}: regions 0 and 1", run.protocol);
        let classes: Vec<&String> = run.latency_us_by_class.keys().collect();
        if run.protocol == "occ" {
            assert_eq!(classes, ["distributed", "single-node"]);
        } else {
            assert_eq!(classes, ["single-node"], "[bench.protocol] set distributed = 0 for it alone");
        }
    }
    assert!(r.claims[0].measured.is_some_and(|m| m > 10.0), "{:?}", r.claims[0]);
}
