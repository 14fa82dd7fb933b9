//! TLS and mTLS through `Client::tls`, against two real sidecars serving `[server.tls]` with
//! certificates made for this run (`python -m tests.certificates`): one with TLS, one with mTLS
//! (a client CA set), both with a tenant.

mod common;

use std::path::PathBuf;

use common::{Sidecar, make_certificates};
use context_sidecar_client::{Client, TlsFiles, pb};
use tonic::Code;

const TOKEN: &str = "rust-client-token-tls";

/// Opens a run and assembles its first turn through `client`: the window holds what was sent.
async fn assemble_one_turn(client: &Client, run_id: &str) {
    let opened = client
        .open_run(pb::OpenRunRequest {
            run_id: run_id.into(),
            token_counter: Some("chars".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert!(opened.created);
    let content = format!("a question sent over TLS to {run_id}");
    let turn = client
        .assemble_context(pb::AssembleContextRequest {
            run_id: run_id.into(),
            iteration: 1,
            append_events: vec![pb::Event {
                event_id: "q1".into(),
                role: "user".into(),
                content: content.clone(),
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let entries: Vec<_> = turn
        .entries
        .iter()
        .map(|e| (e.event_id.as_str(), e.text.as_str()))
        .collect();
    assert_eq!(entries, [("q1", content.as_str())]);
}

/// The client's first call is refused before it reaches the sidecar: UNAVAILABLE, no reason.
async fn refusal(client: Client) -> String {
    let error = client
        .with_retries(0)
        .get_capabilities(pb::GetCapabilitiesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(error.code, Code::Unavailable, "{error}");
    assert_eq!(
        error.reason, "",
        "the call never reached the sidecar: {error}"
    );
    error.message
}

#[tokio::test]
async fn tls_and_mtls_answer_the_right_certificates_and_refuse_the_others() {
    let folder = std::env::temp_dir().join(format!(
        "cs-rust-tls-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    make_certificates(&folder);
    let pem = |stem: &str| folder.join(format!("{stem}.pem"));
    let key = |stem: &str| folder.join(format!("{stem}.key"));
    let (server_pem, server_key, ca) = (pem("server"), key("server"), pem("ca"));
    let server = [
        "--tls-cert-file".as_ref(),
        server_pem.as_os_str(),
        "--tls-key-file".as_ref(),
        server_key.as_os_str(),
    ];
    let tenants = [("host", TOKEN)];
    let tls = Sidecar::with_tenants_and(&tenants, &server);
    let mtls = Sidecar::with_tenants_and(
        &tenants,
        &[
            &server[..],
            &["--tls-client-ca-file".as_ref(), ca.as_os_str()],
        ]
        .concat(),
    );
    let connect = |sidecar: &Sidecar, files: TlsFiles| {
        Client::connect(sidecar.address())
            .unwrap()
            .with_token(TOKEN)
            .unwrap()
            .tls(files)
            .unwrap()
    };
    let trusting = |ca_file: PathBuf| TlsFiles {
        ca_file,
        ..Default::default()
    };
    let with_certificate = |stem: &str| TlsFiles {
        ca_file: pem("ca"),
        cert_file: Some(pem(stem)),
        key_file: Some(key(stem)),
    };

    // TLS: the CA's client gets a turn assembled, the token naming the tenant; another CA's is refused.
    assemble_one_turn(&connect(&tls, trusting(pem("ca"))), "over-tls").await;
    let refused = refusal(connect(&tls, trusting(pem("other-ca")))).await;
    assert!(
        refused.contains("UnknownIssuer"),
        "the refusal says the certificate's issuer is unknown: {refused}"
    );
    refusal(
        Client::connect(tls.address())
            .unwrap()
            .with_token(TOKEN)
            .unwrap(),
    )
    .await; // plaintext

    // mTLS: a certificate the CA signed gets a turn assembled; none, or another CA's, is refused.
    assemble_one_turn(&connect(&mtls, with_certificate("client")), "over-mtls").await;
    refusal(connect(&mtls, trusting(pem("ca")))).await;
    refusal(connect(&mtls, with_certificate("other-client"))).await;

    // Files that cannot be used are the error of tls(), naming them.
    let error_of = |files: TlsFiles| match Client::connect(mtls.address()).unwrap().tls(files) {
        Ok(_) => panic!("tls() accepted files it cannot use"),
        Err(error) => error.to_string(),
    };
    let mismatched = error_of(TlsFiles {
        key_file: Some(key("other-client")),
        ..with_certificate("client")
    });
    assert!(
        mismatched.contains(&key("other-client").display().to_string())
            && mismatched.contains("KeyMismatch"),
        "{mismatched}"
    );
    let halves = error_of(TlsFiles {
        key_file: None,
        ..with_certificate("client")
    });
    assert!(
        halves.contains("cert_file and key_file go together"),
        "{halves}"
    );
    let absent = folder.join("absent.pem");
    let unreadable = error_of(trusting(absent.clone()));
    assert!(
        unreadable.starts_with(&format!("tls ca_file: cannot read {}", absent.display())),
        "{unreadable}"
    );
    let keys_only = error_of(trusting(key("client")));
    assert!(
        keys_only.ends_with("holds no PEM certificate"),
        "{keys_only}"
    );
    let _ = std::fs::remove_dir_all(&folder);
}
