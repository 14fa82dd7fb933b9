//! One turn of a host, and a refused call decoded. The sidecar is at $SIDECAR_ADDRESS
//! (127.0.0.1:50051 when unset); $SIDECAR_TOKEN is the tenant's token, if it has tenants.
use context_sidecar_client::{Client, pb};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let address = std::env::var("SIDECAR_ADDRESS").unwrap_or_else(|_| "127.0.0.1:50051".into());
    let mut client = Client::connect(address)?;
    if let Ok(token) = std::env::var("SIDECAR_TOKEN") {
        client = client.with_token(&token)?;
    }
    client
        .open_run(pb::OpenRunRequest {
            run_id: "run-1".into(),
            token_counter: Some("o200k_base".into()),
            transcript_token_budget: Some(8000),
            ..Default::default()
        })
        .await?;
    let turn = client
        .assemble_context(pb::AssembleContextRequest {
            run_id: "run-1".into(),
            iteration: 1,
            append_events: vec![
                pb::Event {
                    event_id: "u1".into(),
                    role: "user".into(),
                    content: "What does the refund policy say?".into(),
                    ..Default::default()
                },
                pb::Event {
                    event_id: "c1".into(),
                    role: "assistant".into(),
                    r#type: "tool_call".into(),
                    call_id: "k1".into(),
                    tool_name: "search".into(),
                    content: r#"{"q": "refund"}"#.into(),
                    ..Default::default()
                },
                pb::Event {
                    event_id: "r1".into(),
                    role: "tool".into(),
                    r#type: "tool_result".into(),
                    call_id: "k1".into(),
                    content: "30 days.".into(),
                    ..Default::default()
                },
            ],
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
            println!("{} {}", field.field, field.description); // events[0].event_id is required
        }
    }
    Ok(())
}
