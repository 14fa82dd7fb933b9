//! The Rust client's run of the clients' common bench protocol (benchmarks/_lib/client_bench.py
//! says it in full): fill run "bench-rust" with 200 events, assemble the last iteration once,
//! then for --rounds rounds time a health check and a re-assembly of that iteration, and print
//! one JSON line: {"client": "rust", "health_p50_us": x, "assemble_p50_us": y, "rounds": N}.
//!
//!     cargo run --release --example bench -- --target 127.0.0.1:50051 --rounds 300
use std::time::{Duration, Instant};

use context_sidecar_client::{Client, pb};

const RUN_ID: &str = "bench-rust";
const EVENTS: i32 = 200;
const PER_TURN: i32 = 4;
const BUDGET: i32 = 8000;
const WORDS: &str = "refund policy kettle order shipping invoice customer damaged clause days warranty receipt \
                     the a within agent reads file calls tool search summary token cache";

/// Event i's text: 60 words drawn by the C library's old rand(), seeded i + 1 (as every client).
fn content(i: i32) -> String {
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut state = (i + 1) as u64;
    (0..60)
        .map(|_| {
            state = (state * 1103515245 + 12345) & 0x7FFF_FFFF;
            words[((state >> 16) % words.len() as u64) as usize]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The median, in microseconds to 0.1.
fn p50_us(mut times: Vec<Duration>) -> f64 {
    times.sort();
    let n = times.len();
    let median = if n % 2 == 1 {
        times[n / 2]
    } else {
        (times[n / 2 - 1] + times[n / 2]) / 2
    };
    (median.as_nanos() as f64 / 100.0).round() / 10.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut target, mut rounds, mut token) = ("127.0.0.1:50051".to_owned(), 300usize, None);
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--target" => target = value,
            "--rounds" => rounds = value.parse()?,
            "--token" => token = Some(value),
            _ => return Err(format!("unknown flag {flag}").into()),
        }
    }
    if rounds < 1 {
        return Err("--rounds must be at least 1".into());
    }
    let mut client = Client::connect(target)?;
    if let Some(token) = token {
        client = client.with_token(&token)?;
    }
    client
        .open_run(pb::OpenRunRequest {
            run_id: RUN_ID.into(),
            token_counter: Some("o200k_base".into()),
            transcript_token_budget: Some(BUDGET),
            ..Default::default()
        })
        .await?;
    let events = (0..EVENTS)
        .map(|i| pb::Event {
            event_id: format!("e{i}"),
            iteration: i / PER_TURN + 1,
            role: if i % 2 == 0 { "user" } else { "assistant" }.into(),
            content: content(i),
            ..Default::default()
        })
        .collect();
    client
        .append_events(pb::AppendEventsRequest {
            run_id: RUN_ID.into(),
            events,
        })
        .await?;
    let last = (EVENTS - 1) / PER_TURN + 1;
    let mut request = pb::AssembleContextRequest {
        run_id: RUN_ID.into(),
        iteration: last,
        ..Default::default()
    };
    client.assemble_context(request.clone()).await?; // persists the window
    request.max_transcript_tokens = Some(BUDGET);
    let (mut health, mut assemble) = (Vec::with_capacity(rounds), Vec::with_capacity(rounds));
    for _ in 0..rounds {
        let start = Instant::now();
        client.health_check().await?;
        health.push(start.elapsed());
        let start = Instant::now();
        client.assemble_context(request.clone()).await?;
        assemble.push(start.elapsed());
    }
    println!(
        r#"{{"client": "rust", "health_p50_us": {}, "assemble_p50_us": {}, "rounds": {rounds}}}"#,
        p50_us(health),
        p50_us(assemble)
    );
    Ok(())
}
