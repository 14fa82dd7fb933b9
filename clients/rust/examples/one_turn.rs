//! One turn of a host, and a refused call decoded. Run against a sidecar:
//! `cargo run --example one_turn -- http://127.0.0.1:50051`
use context_sidecar_client::{Client, pb};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let target = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://127.0.0.1:50051".into());
    let client = Client::connect(target)?; // .with_token("...")? when the sidecar has tenants
    client
        .open_run(pb::OpenRunRequest {
            run_id: "run-1".into(),
            token_counter: Some("o200k_base".into()),
            transcript_token_budget: Some(8000),
            ..Default::default()
        })
        .await?;
    let user = pb::Event {
        event_id: "u1".into(),
        role: "user".into(),
        content: "What does the refund policy say?".into(),
        ..Default::default()
    };
    let turn = client
        .assemble_context(pb::AssembleContextRequest {
            run_id: "run-1".into(),
            iteration: 1,
            append_events: vec![user],
            ..Default::default()
        })
        .await?;
    for entry in &turn.entries {
        println!("{} {} tokens", entry.event_id, entry.tokens);
    }

    let nameless = pb::Event {
        role: "user".into(),
        ..Default::default()
    };
    let refused = pb::AppendEventsRequest {
        run_id: "run-1".into(),
        events: vec![nameless],
    };
    if let Err(error) = client.append_events(refused).await {
        println!("{:?} {}", error.code, error.reason); // InvalidArgument validation_error
        for field in &error.fields {
            println!("{} {}", field.field, field.description); // events[0].event_id ...
        }
    }
    Ok(())
}
