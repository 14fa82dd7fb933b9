//! The client against a real sidecar: one turn, a refused call decoded, the example programs.

mod common;

use std::path::{Path, PathBuf};

use common::Sidecar;
use context_sidecar_client::{Client, Error, ServingStatus, pb};
use tonic::Code;

fn event(event_id: &str, role: &str, kind: &str, call_id: &str, content: &str) -> pb::Event {
    pb::Event {
        event_id: event_id.into(),
        role: role.into(),
        r#type: kind.into(),
        call_id: call_id.into(),
        content: content.into(),
        tool_name: if kind == "tool_call" {
            "search".into()
        } else {
            String::new()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn one_turn_counts_what_it_feeds() {
    let sidecar = Sidecar::start();
    let client = Client::connect(sidecar.target.clone()).unwrap();
    assert_eq!(client.health_check().await.unwrap(), ServingStatus::Serving);
    let counter = "o200k_base";
    client
        .open_run(pb::OpenRunRequest {
            run_id: "run-1".into(),
            token_counter: Some(counter.into()),
            transcript_token_budget: Some(8000),
            ..Default::default()
        })
        .await
        .unwrap();
    let events = vec![
        event(
            "u1",
            "user",
            "message",
            "",
            "What does the refund policy say?",
        ),
        event("c1", "assistant", "tool_call", "k1", r#"{"q": "refund"}"#),
        event(
            "r1",
            "tool",
            "tool_result",
            "k1",
            "Refunds are accepted within 30 days of purchase.",
        ),
    ];
    let turn = client
        .assemble_context(pb::AssembleContextRequest {
            run_id: "run-1".into(),
            iteration: 1,
            append_events: events,
            ..Default::default()
        })
        .await
        .unwrap();

    let ids: Vec<&str> = turn
        .entries
        .iter()
        .map(|entry| entry.event_id.as_str())
        .collect();
    assert_eq!(ids, ["u1", "c1", "r1"]);
    assert_eq!(turn.token_counter, counter);
    // Each entry's tokens recounted by CountTokens, and the answer's total their sum.
    let recount = client
        .count_tokens(pb::CountTokensRequest {
            token_counter: counter.into(),
            texts: turn
                .entries
                .iter()
                .map(|entry| entry.text.clone())
                .collect(),
        })
        .await
        .unwrap();
    let tokens: Vec<i32> = turn.entries.iter().map(|entry| entry.tokens).collect();
    assert_eq!(tokens, recount.counts);
    assert!(tokens.iter().all(|&n| n > 0), "{tokens:?}");
    assert_eq!(turn.token_count, recount.counts.iter().sum::<i32>());
    assert!(turn.token_count <= turn.token_budget);
}

#[tokio::test]
async fn a_refused_call_carries_its_reason_and_bad_field() {
    let sidecar = Sidecar::start();
    let client = Client::connect(sidecar.target.clone()).unwrap();
    client
        .open_run(pb::OpenRunRequest {
            run_id: "run-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let bad = pb::AssembleContextRequest {
        run_id: "run-1".into(),
        iteration: 1,
        append_events: vec![event("", "user", "message", "", "no id")],
        ..Default::default()
    };
    let error = client.assemble_context(bad).await.unwrap_err();
    assert_eq!(error.method, "AssembleContext");
    assert_eq!(error.code, Code::InvalidArgument);
    assert_eq!(error.reason, "validation_error");
    assert!(
        error.has_field("append_events[0].event_id"),
        "{:?}",
        error.fields
    );
    // A failed call writes nothing: the run has no events.
    let listed = client
        .list_run_events(pb::ListRunEventsRequest {
            run_id: "run-1".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(listed.events.is_empty(), "{:?}", listed.events);
}

#[tokio::test]
async fn the_token_names_the_tenant() {
    let sidecar = Sidecar::with_tenants(&[("alpha", "rust-client-token-alpha")]);
    let count = || pb::CountTokensRequest {
        token_counter: "chars".into(),
        texts: vec!["four".into()],
    };
    let anonymous = Client::connect(sidecar.target.clone()).unwrap();
    let error = anonymous.count_tokens(count()).await.unwrap_err();
    assert_eq!(
        (error.code, error.reason.as_str()),
        (Code::Unauthenticated, "unauthenticated")
    );
    let wrong = anonymous.clone().with_token("not-a-tenant's").unwrap();
    let error = wrong.count_tokens(count()).await.unwrap_err();
    assert_eq!(
        (error.code, error.reason.as_str()),
        (Code::Unauthenticated, "unauthenticated")
    );
    let alpha = anonymous.with_token("rust-client-token-alpha").unwrap();
    assert_eq!(alpha.count_tokens(count()).await.unwrap().counts, [4]);
}

#[tokio::test]
async fn a_stopped_sidecar_is_unavailable_after_the_retries() {
    let sidecar = Sidecar::start();
    let target = sidecar.target.clone();
    drop(sidecar);
    let client = Client::connect(target).unwrap().with_retries(2);
    let started = std::time::Instant::now();
    let error = client
        .count_tokens(pb::CountTokensRequest {
            token_counter: "chars".into(),
            texts: vec!["x".into()],
        })
        .await
        .unwrap_err();
    assert_eq!(error.code, Code::Unavailable);
    assert_eq!(error.reason, "", "the call never reached a sidecar");
    // Two pauses were taken: at least 0.05 s + 0.1 s (each at least half of 0.1 s, 0.2 s).
    assert!(
        started.elapsed() >= std::time::Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
}

/// The target folder of this `cargo test` (the test binary is target/debug/deps/sidecar-*).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.ancestors().nth(3).unwrap().to_path_buf()
}

/// Runs a program built by this `cargo test` and gives what it printed; it must succeed.
fn run_program(program: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let output = std::process::Command::new(program)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{}: {stdout}\n{}",
        program.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// An example program: a whole `cargo test` builds the examples into target/debug/examples,
/// while `cargo test --test sidecar` alone does not rebuild them.
fn example(name: &str) -> PathBuf {
    target_dir().join("debug").join("examples").join(name)
}

#[test]
fn the_bench_program_prints_its_json_line() {
    let sidecar = Sidecar::start();
    let stdout = run_program(
        &example("bench"),
        &["--target", sidecar.address(), "--rounds", "2"],
        &[],
    );
    let line = stdout.trim();
    assert!(
        line.starts_with(r#"{"client": "rust", "health_p50_us": "#),
        "{line}"
    );
    assert!(line.ends_with(r#", "rounds": 2}"#), "{line}");
}

/// Runs a build of examples/one_turn.rs as the docs say, against a sidecar with a tenant, and
/// checks what it printed: the sidecar's window of the turn (each entry's tokens recounted by
/// CountTokens), then the refused call's code, reason and bad field.
async fn one_turn_runs(program: &Path) {
    let token = "rust-example-token";
    let sidecar = Sidecar::with_tenants(&[("example", token)]);
    let env = [
        ("SIDECAR_ADDRESS", sidecar.address()),
        ("SIDECAR_TOKEN", token),
    ];
    let stdout = run_program(program, &[], &env);

    let client = Client::connect(sidecar.address())
        .unwrap()
        .with_token(token)
        .unwrap();
    let window = client
        .get_transcript_window(pb::GetTranscriptWindowRequest {
            run_id: "run-1".into(),
            iteration: 1,
        })
        .await
        .unwrap();
    let recount = client
        .count_tokens(pb::CountTokensRequest {
            token_counter: window.token_counter.clone(),
            texts: window.entries.iter().map(|e| e.rendered.clone()).collect(),
        })
        .await
        .unwrap();
    let tokens: Vec<i32> = window.entries.iter().map(|e| e.tokens).collect();
    assert_eq!(tokens, recount.counts);
    let mut expected: Vec<String> = window
        .entries
        .iter()
        .map(|e| format!("{} {} tokens", e.event_id, e.tokens))
        .collect();
    assert_eq!(window.event_ids, ["u1", "c1", "r1"]);
    expected.push("InvalidArgument validation_error".into());
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[..lines.len() - 1], expected, "{stdout}");
    let field = lines.last().unwrap();
    assert!(
        field.starts_with("events[0].event_id ") && field.len() > "events[0].event_id ".len(),
        "{stdout}"
    );
}

#[tokio::test]
async fn the_one_turn_example_runs() {
    one_turn_runs(&example("one_turn")).await;
}

/// The crate installed as a host installs it: a crate of its own, elsewhere, depending on this one
/// by path, whose program is examples/one_turn.rs. Built into this test's own target folder, with
/// the same dependency features, so that it reuses the dependencies `cargo test` compiled.
#[tokio::test]
async fn a_host_crate_depending_by_path_runs_one_turn() {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let host = std::env::temp_dir().join(format!("cs-rust-host-{}", std::process::id()));
    std::fs::create_dir_all(host.join("src")).unwrap();
    // tokio with the features of this crate's dev-dependency, so no dependency builds twice.
    let cargo_toml = format!(
        "[package]\nname = \"host\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[dependencies]\n\
         context-sidecar-client = {{ path = {:?} }}\n\
         tokio = {{ version = \"1\", features = [\"rt-multi-thread\", \"macros\"] }}\n",
        manifest.display().to_string()
    );
    std::fs::write(host.join("Cargo.toml"), cargo_toml).unwrap();
    std::fs::copy(
        manifest.join("examples/one_turn.rs"),
        host.join("src/main.rs"),
    )
    .unwrap();
    // The client's resolved versions (those that build with its rust-version), as a host's lock would hold.
    std::fs::copy(manifest.join("Cargo.lock"), host.join("Cargo.lock")).unwrap();
    let target = target_dir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = std::process::Command::new(cargo)
        .args(["build", "--quiet"])
        .current_dir(&host)
        .env("CARGO_TARGET_DIR", &target)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&host);
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    one_turn_runs(&target.join("debug").join("host")).await;
}

/// What the generated stub answers (WatchEvents' stream comes only from it) decodes the same way.
#[tokio::test]
async fn a_status_from_the_stub_decodes_into_an_error() {
    let sidecar = Sidecar::start();
    let client = Client::connect(sidecar.address()).unwrap();
    let status = client
        .stub()
        .count_tokens(pb::CountTokensRequest {
            token_counter: "bpe".into(),
            texts: vec!["x".into()],
        })
        .await
        .unwrap_err();
    let error = Error::from_status("CountTokens", &status);
    assert_eq!(
        (error.code, error.reason.as_str()),
        (Code::InvalidArgument, "validation_error")
    );
    assert!(error.has_field("token_counter"), "{:?}", error.fields);
}
