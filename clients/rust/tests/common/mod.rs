//! A real sidecar for the tests: `python -m sidecar serve` (python from PATH, the project's venv
//! in ./dev.sh test) run from the repository root on a free loopback port, storing in a fresh
//! temporary directory; killed when the handle is dropped.

// Each test crate compiles this module and uses a part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const READY_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Sidecar {
    child: Child,
    storage: PathBuf,
    /// Where it serves, as a channel target: `http://127.0.0.1:PORT`.
    pub target: String,
}

impl Sidecar {
    pub fn start() -> Sidecar {
        Self::start_with(&[])
    }

    /// A sidecar whose tenants are `(id, token)`: every call must then carry a tenant's token.
    pub fn with_tenants(tenants: &[(&str, &str)]) -> Sidecar {
        Self::with_tenants_and(tenants, &[])
    }

    /// A sidecar with tenants, and `flags` after the common ones.
    pub fn with_tenants_and(tenants: &[(&str, &str)], flags: &[&std::ffi::OsStr]) -> Sidecar {
        use sha2::{Digest, Sha256};
        let config = tenants
            .iter()
            .map(|(id, token)| {
                format!(
                    "[[auth.tenants]]\nid = {id:?}\ntoken_sha256 = \"{:x}\"\n\n",
                    Sha256::digest(token)
                )
            })
            .collect::<String>();
        let path = std::env::temp_dir().join(format!(
            "cs-rust-{}-{}.toml",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::write(&path, config).unwrap();
        let sidecar = Self::start_with(&[&["--config".as_ref(), path.as_os_str()], flags].concat());
        let _ = std::fs::remove_file(&path); // read once, at start
        sidecar
    }

    fn start_with(flags: &[&std::ffi::OsStr]) -> Sidecar {
        let repository = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let storage = std::env::temp_dir().join(format!(
            "cs-rust-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        let mut child = Command::new("python")
            .args([
                "-m",
                "sidecar",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--log-level",
                "WARNING",
                "--storage-path",
            ])
            .arg(&storage)
            .args(flags)
            .current_dir(repository)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cannot start the sidecar with the python on PATH");
        let stdout = child.stdout.take().unwrap();
        let (ready, address) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            for line in lines.by_ref().map_while(Result::ok) {
                if let Some(address) = line.trim().strip_prefix("context-sidecar serving on ") {
                    let _ = ready.send(address.to_owned());
                    break;
                }
            }
            lines.for_each(drop); // keep reading, so the sidecar never blocks on a full pipe
        });
        match address.recv_timeout(READY_TIMEOUT) {
            Ok(address) => Sidecar {
                child,
                storage,
                target: format!("http://{address}"),
            },
            Err(_) => {
                let _ = child.kill();
                let mut stderr = String::new();
                let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
                let _ = std::fs::remove_dir_all(&storage);
                panic!(
                    "the sidecar did not say where it serves within {READY_TIMEOUT:?}; stderr:\n{stderr}"
                );
            }
        }
    }
}

/// Writes a fresh CA and its certificates into `folder` with `python -m tests.certificates`, as
/// every suite's TLS tests do: ca.pem, server.pem/.key, client.pem/.key, other-ca.pem,
/// other-client.pem/.key, ...
pub fn make_certificates(folder: &std::path::Path) {
    let repository = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let made = Command::new("python")
        .args(["-m", "tests.certificates"])
        .arg(folder)
        .current_dir(repository)
        .output()
        .expect("cannot run the python on PATH");
    assert!(
        made.status.success(),
        "python -m tests.certificates failed: {}",
        String::from_utf8_lossy(&made.stderr)
    );
}

impl Sidecar {
    /// Where it serves as the other clients take it: `127.0.0.1:PORT`.
    pub fn address(&self) -> &str {
        self.target.trim_start_matches("http://")
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.storage);
    }
}
