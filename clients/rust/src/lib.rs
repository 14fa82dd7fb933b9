//! A client for context-sidecar: the generated messages (`pb`) and a small [`Client`] that
//! retries what is safe to retry, holds each call to one deadline, and decodes a refused call's
//! rich status into an [`Error`] (gRPC code, ErrorInfo reason, BadRequest field violations).
//!
//! ```no_run
//! # async fn run() -> Result<(), context_sidecar_client::Error> {
//! use context_sidecar_client::{pb, Client};
//! let client = Client::connect("127.0.0.1:50051").unwrap();
//! let turn = client
//!     .assemble_context(pb::AssembleContextRequest { run_id: "run-1".into(), iteration: 1, ..Default::default() })
//!     .await?;
//! println!("{} tokens", turn.token_count);
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};
use tonic::{Code, Request, Status};
use tonic_types::StatusExt;

/// The messages and the generated stub of `contextsidecar.v1`.
pub mod pb {
    tonic::include_proto!("contextsidecar.v1");
}

use pb::context_sidecar_client::ContextSidecarClient;
pub use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// The whole call with its retries, as the Python, Node, Go and Java clients wait.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Retries after the first attempt: up to 1.5 s of pauses, enough for a sidecar restart.
pub const DEFAULT_RETRIES: u32 = 4;
const FIRST_PAUSE: f64 = 0.1; // seconds, doubling per retry, each drawn from [half, whole]
const LONGEST_PAUSE: f64 = 2.0;

/// One bad request field and what is wrong with it (google.rpc.BadRequest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    /// The field's path in the request, e.g. `append_events[2].iteration`.
    pub field: String,
    pub description: String,
}

/// A call the sidecar (or the channel) refused, decoded from its grpc-status-details-bin.
#[derive(Debug, Clone)]
pub struct Error {
    /// The RPC, e.g. `AssembleContext`.
    pub method: &'static str,
    pub code: Code,
    pub message: String,
    /// The sidecar's machine code (ErrorInfo.reason: `validation_error`, `not_found`, ...);
    /// empty when the call never reached the sidecar.
    pub reason: String,
    /// ErrorInfo.metadata, e.g. `{"events_needed": "3"}`.
    pub metadata: HashMap<String, String>,
    pub fields: Vec<FieldViolation>,
}

impl Error {
    /// Whether the sidecar named `field` as a bad field.
    pub fn has_field(&self, field: &str) -> bool {
        self.fields.iter().any(|violation| violation.field == field)
    }

    /// Decodes a status the generated stub returned (`stub()`, for `WatchEvents`' stream) the way
    /// `Client`'s calls decode theirs; `method` names the RPC in the error.
    pub fn from_status(method: &'static str, status: &Status) -> Self {
        let details = status.get_error_details();
        let (reason, metadata) = details
            .error_info()
            .map(|info| (info.reason.clone(), info.metadata.clone()))
            .unwrap_or_default();
        let fields = details
            .bad_request()
            .map(|bad| {
                bad.field_violations
                    .iter()
                    .map(|v| FieldViolation {
                        field: v.field.clone(),
                        description: v.description.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        Error {
            method,
            code: status.code(),
            message: status.message().to_owned(),
            reason,
            metadata,
            fields,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?}", self.method, self.code)?;
        if !self.reason.is_empty() {
            write!(f, " ({})", self.reason)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for Error {}

/// The PEM files of a TLS connection to a sidecar that serves `[server.tls]`, for [`Client::tls`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate(s) the sidecar's certificate must be signed by.
    pub ca_file: PathBuf,
    /// The client's certificate chain, for a sidecar that requires one (mTLS); with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// The private key of `cert_file` (PKCS#8 or SEC1, unencrypted).
    pub key_file: Option<PathBuf>,
}

/// TLS files that cannot be used: the message names the file and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsError(String);

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for TlsError {}

impl TlsFiles {
    /// The files given, for an error that cannot tell which one it was.
    fn named(&self) -> String {
        [
            Some(&self.ca_file),
            self.cert_file.as_ref(),
            self.key_file.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|file| file.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// tonic's TLS configuration, the files read now (the first call would otherwise find a bad
    /// one, as UNAVAILABLE like an unreachable sidecar).
    fn config(&self) -> Result<ClientTlsConfig, TlsError> {
        fn read(option: &str, file: &Path) -> Result<Vec<u8>, TlsError> {
            std::fs::read(file).map_err(|error| {
                TlsError(format!(
                    "tls {option}: cannot read {}: {error}",
                    file.display()
                ))
            })
        }
        let ca = read("ca_file", &self.ca_file)?;
        // An empty trust store is no error to rustls: every handshake would fail instead.
        if !String::from_utf8_lossy(&ca).contains("-----BEGIN CERTIFICATE-----") {
            return Err(TlsError(format!(
                "tls ca_file: {} holds no PEM certificate",
                self.ca_file.display()
            )));
        }
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        match (&self.cert_file, &self.key_file) {
            (None, None) => Ok(config),
            (Some(cert_file), Some(key_file)) => Ok(config.identity(Identity::from_pem(
                read("cert_file", cert_file)?,
                read("key_file", key_file)?,
            ))),
            _ => Err(TlsError(
                "tls cert_file and key_file go together: give both (mTLS) or neither".into(),
            )),
        }
    }
}

/// An error and its causes, each after a colon: tonic's own says only "transport error".
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(inner) = cause {
        text = format!("{text}: {inner}");
        cause = inner.source();
    }
    text
}

/// A status tonic made of the connection failing under the call (its source is the transport's
/// error, and no deadline passed), not one the sidecar sent, as UNAVAILABLE: the call got no
/// answer, which is what the other clients and gRPC call it. tonic says CANCELLED or UNKNOWN when
/// the server closes the connection, as a TLS 1.3 server does after the handshake when it refuses
/// the client's certificate; the causes then say why.
fn unanswered(status: Status) -> Status {
    let Some(source) = std::error::Error::source(&status) else {
        return status;
    };
    let mut timed_out = false;
    let mut cause = Some(source);
    while let Some(error) = cause {
        timed_out |= error.is::<tonic::TimeoutExpired>();
        cause = error.source();
    }
    if timed_out || !matches!(status.code(), Code::Cancelled | Code::Unknown) {
        return status;
    }
    Status::unavailable(causes(source))
}

/// The pause before retry number `retry` (1-based) of a failed attempt, or None: give up.
/// Only UNAVAILABLE is retried, and never past the call's deadline.
fn pause_before_retry(
    code: Code,
    retry: u32,
    retries: u32,
    remaining: Duration,
) -> Option<Duration> {
    if code != Code::Unavailable || retry > retries {
        return None;
    }
    let whole = (FIRST_PAUSE * 2f64.powi(retry as i32 - 1)).min(LONGEST_PAUSE);
    let pause = Duration::from_secs_f64(whole * (0.5 + 0.5 * fastrand::f64()));
    (pause < remaining).then_some(pause)
}

/// A client of one sidecar. Cheap to clone: clones share the channel, which reconnects by itself.
#[derive(Clone)]
pub struct Client {
    /// Where `connect` was pointed (None: `with_channel`), for `tls` to point the channel again.
    endpoint: Option<Endpoint>,
    stub: ContextSidecarClient<Channel>,
    health: HealthClient<Channel>,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    timeout: Duration,
    retries: u32,
}

impl Client {
    /// A client of the sidecar at `target`: `host:port`, as the other clients take it, or a URI
    /// (`http://host:port`). The channel connects on the first call, so a sidecar that is still
    /// starting is waited for by the retries.
    pub fn connect(target: impl Into<String>) -> Result<Self, tonic::transport::Error> {
        let mut target = target.into();
        if !target.contains("://") {
            target = format!("http://{target}");
        }
        let endpoint = Endpoint::from_shared(target)?;
        Ok(Client {
            endpoint: Some(endpoint.clone()),
            ..Self::with_channel(endpoint.connect_lazy())
        })
    }

    /// TLS to a sidecar serving `[server.tls]`, for a client made by [`Client::connect`] (before
    /// its first call): trusting `files.ca_file`, and presenting `files.cert_file` under mTLS. The
    /// sidecar's certificate must name the target's host. The files are read now: an error names
    /// the one that cannot be read or used (a key that is not the certificate's, too).
    pub fn tls(self, files: TlsFiles) -> Result<Self, TlsError> {
        let endpoint = self.endpoint.as_ref().ok_or_else(|| {
            TlsError("tls: this client's channel is the host's own; give it TLS there".into())
        })?;
        let config = files.config()?;
        // tonic speaks TLS to https:// URIs only.
        let uri = endpoint.uri();
        let https = Endpoint::from_shared(format!(
            "https://{}{}",
            uri.authority().map_or("", |authority| authority.as_str()),
            uri.path()
        ))
        .and_then(|endpoint| endpoint.tls_config(config))
        .map_err(|error| {
            TlsError(format!(
                "tls: {} cannot be used: {}",
                files.named(),
                causes(&error)
            ))
        })?;
        let channel = https.connect_lazy();
        Ok(Client {
            endpoint: Some(https),
            stub: ContextSidecarClient::new(channel.clone()),
            health: HealthClient::new(channel),
            ..self
        })
    }

    /// A client over a channel the host configured itself (TLS, its own timeouts).
    pub fn with_channel(channel: Channel) -> Self {
        Client {
            endpoint: None,
            stub: ContextSidecarClient::new(channel.clone()),
            health: HealthClient::new(channel),
            authorization: None,
            timeout: DEFAULT_TIMEOUT,
            retries: DEFAULT_RETRIES,
        }
    }

    /// The bearer token every call carries when the sidecar has tenants.
    pub fn with_token(
        mut self,
        token: &str,
    ) -> Result<Self, tonic::metadata::errors::InvalidMetadataValue> {
        self.authorization = Some(format!("Bearer {token}").parse()?);
        Ok(self)
    }

    /// The deadline of a whole call, its retries included.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// How many times an UNAVAILABLE idempotent call is tried again (0: never).
    pub fn with_retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Whether the sidecar serves (grpc.health.v1, the whole server): SERVING once its store
    /// is open. Retried like the reads.
    pub async fn health_check(&self) -> Result<ServingStatus, Error> {
        let request = HealthCheckRequest {
            service: String::new(),
        };
        let answer = self
            .call("Health/Check", true, request, |r| {
                let mut health = self.health.clone();
                async move { health.check(r).await }
            })
            .await?;
        Ok(answer.status())
    }

    /// The generated stub, for what this client does not wrap (WatchEvents' stream).
    pub fn stub(&self) -> ContextSidecarClient<Channel> {
        self.stub.clone()
    }

    /// One call: each attempt gets what is left of the deadline; an idempotent call that met
    /// UNAVAILABLE (which may come after the sidecar did the work) is tried again after a pause.
    async fn call<Req, Resp, Fut>(
        &self,
        method: &'static str,
        idempotent: bool,
        request: Req,
        attempt: impl Fn(Request<Req>) -> Fut,
    ) -> Result<Resp, Error>
    where
        Req: Clone,
        Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
    {
        let deadline = Instant::now() + self.timeout;
        let mut retry = 0;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let mut grpc_request = Request::new(request.clone());
            grpc_request.set_timeout(remaining);
            if let Some(value) = &self.authorization {
                grpc_request
                    .metadata_mut()
                    .insert("authorization", value.clone());
            }
            let status = match tokio::time::timeout(remaining, attempt(grpc_request)).await {
                Ok(Ok(response)) => return Ok(response.into_inner()),
                Ok(Err(status)) => unanswered(status),
                Err(_) => Status::deadline_exceeded("the call's deadline passed"),
            };
            retry += 1;
            let retries = if idempotent { self.retries } else { 0 };
            let remaining = deadline.saturating_duration_since(Instant::now());
            match pause_before_retry(status.code(), retry, retries, remaining) {
                Some(pause) => tokio::time::sleep(pause).await,
                None => return Err(Error::from_status(method, &status)),
            }
        }
    }
}

/// Each unary RPC as a method of [`Client`]; `idempotent` says whether a repeat leaves what one
/// call leaves (the Python client's table, clients/python/context_sidecar_client/calls.py, kept
/// the same).
macro_rules! rpcs {
    ($($fn:ident, $name:literal, $req:ident => $resp:ident, |$r:ident| $idempotent:expr;)*) => {
        impl Client {
            $(
                #[doc = concat!("The `", $name, "` RPC.")]
                pub async fn $fn(&self, request: pb::$req) -> Result<pb::$resp, Error> {
                    let idempotent = { let $r = &request; $idempotent };
                    self.call($name, idempotent, request, |r| {
                        let mut stub = self.stub.clone();
                        async move { stub.$fn(r).await }
                    })
                    .await
                }
            )*
        }
    };
}

// UNAVAILABLE may come after the sidecar did the work and before its answer arrived, so only a
// call whose repeat answers without an error is retried: the reads, the writes of things the host
// names, and the writes that replace a value with the same one. Never: the deletes and
// UnloadSkill (a repeat would answer NOT_FOUND); PutMemory without entry_id and CompactMemory
// without source_ids (each call makes or distils something new).
rpcs! {
    open_run, "OpenRun", OpenRunRequest => OpenRunResponse, |_r| true;
    append_events, "AppendEvents", AppendEventsRequest => AppendEventsResponse, |_r| true;
    list_run_events, "ListRunEvents", ListRunEventsRequest => ListRunEventsResponse, |_r| true;
    assemble_context, "AssembleContext", AssembleContextRequest => AssembleContextResponse, |_r| true;
    get_transcript_window, "GetTranscriptWindow", GetTranscriptWindowRequest => GetTranscriptWindowResponse, |_r| true;
    count_tokens, "CountTokens", CountTokensRequest => CountTokensResponse, |_r| true;
    get_capabilities, "GetCapabilities", GetCapabilitiesRequest => GetCapabilitiesResponse, |_r| true;
    record_summary, "RecordSummary", RecordSummaryRequest => RecordSummaryResponse, |_r| true;
    get_artifact, "GetArtifact", GetArtifactRequest => GetArtifactResponse, |_r| true;
    delete_artifact, "DeleteArtifact", DeleteArtifactRequest => DeleteArtifactResponse, |_r| false;
    fork_run, "ForkRun", ForkRunRequest => ForkRunResponse, |_r| true;
    delete_run, "DeleteRun", DeleteRunRequest => DeleteRunResponse, |_r| false;
    put_memory, "PutMemory", PutMemoryRequest => PutMemoryResponse, |r| !r.entry_id.is_empty();
    get_memory, "GetMemory", GetMemoryRequest => MemoryEntry, |_r| true;
    delete_memory, "DeleteMemory", DeleteMemoryRequest => DeleteMemoryResponse, |_r| false;
    list_memory, "ListMemory", ListMemoryRequest => ListMemoryResponse, |_r| true;
    register_secrets, "RegisterSecrets", RegisterSecretsRequest => RegisterSecretsResponse, |_r| true;
    forget_secrets, "ForgetSecrets", ForgetSecretsRequest => ForgetSecretsResponse, |_r| true;
    update_profile, "UpdateProfile", UpdateProfileRequest => UpdateProfileResponse, |_r| true;
    update_task, "UpdateTask", UpdateTaskRequest => UpdateTaskResponse, |_r| true;
    load_skill, "LoadSkill", LoadSkillRequest => LoadSkillResponse, |_r| true;
    unload_skill, "UnloadSkill", UnloadSkillRequest => UnloadSkillResponse, |_r| false;
    put_state_data, "PutStateData", PutStateDataRequest => PutStateDataResponse, |_r| true;
    get_state, "GetState", GetStateRequest => AgentState, |_r| true;
    record_usage, "RecordUsage", RecordUsageRequest => Usage, |_r| true;
    list_compaction_records, "ListCompactionRecords", ListCompactionRecordsRequest => ListCompactionRecordsResponse, |_r| true;
    compact_memory, "CompactMemory", CompactMemoryRequest => CompactMemoryResponse, |r| !r.source_ids.is_empty();
    list_memory_events, "ListMemoryEvents", ListMemoryEventsRequest => ListMemoryEventsResponse, |_r| true;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_the_connection_failed_under_is_unavailable_and_a_deadline_stays_what_it_was() {
        let closed = Status::from_error(Box::new(std::io::Error::other("connection closed")));
        assert_eq!(closed.code(), Code::Unknown);
        let unanswered_closed = unanswered(closed);
        assert_eq!(unanswered_closed.code(), Code::Unavailable);
        assert_eq!(unanswered_closed.message(), "connection closed");
        let timed_out = Status::from_error(Box::new(tonic::TimeoutExpired(())));
        assert_eq!(unanswered(timed_out).code(), Code::Cancelled);
        // What the sidecar itself answered (no transport error under it) is kept as it is.
        assert_eq!(
            unanswered(Status::cancelled("draining")).code(),
            Code::Cancelled
        );
        assert_eq!(
            unanswered(Status::unknown("said the server")).code(),
            Code::Unknown
        );
    }

    #[test]
    fn only_unavailable_is_retried_within_the_retries_and_the_deadline() {
        let plenty = Duration::from_secs(30);
        assert_eq!(
            pause_before_retry(Code::InvalidArgument, 1, 4, plenty),
            None
        );
        assert_eq!(pause_before_retry(Code::Unavailable, 5, 4, plenty), None);
        assert_eq!(
            pause_before_retry(Code::Unavailable, 1, 4, Duration::from_millis(10)),
            None
        );
        for retry in 1..=4 {
            let pause = pause_before_retry(Code::Unavailable, retry, 4, plenty)
                .unwrap()
                .as_secs_f64();
            let whole = (0.1 * 2f64.powi(retry as i32 - 1)).min(2.0);
            assert!(
                pause >= whole / 2.0 && pause <= whole,
                "retry {retry}: {pause} s"
            );
        }
    }
}
