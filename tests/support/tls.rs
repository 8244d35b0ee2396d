use std::path::PathBuf;
use std::process::Command;

/// A CA made now with the `openssl` command, and a certificate for `127.0.0.1` it
/// signed, which every server started with it presents. Their folder is removed
/// when the last server using them is dropped.
pub struct TestCa {
    dir: PathBuf,
    pem: Vec<u8>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let dir = std::env::temp_dir().join(format!(
            "lock-tests-ca-{}-{}",
            std::process::id(),
            crate::server::free_port()
        ));
        std::fs::create_dir_all(&dir).expect("create the CA's folder");
        let openssl = |args: &[&str]| {
            let made = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("run openssl (Debian package openssl)");
            assert!(
                made.status.success(),
                "openssl {args:?} failed: {}",
                String::from_utf8_lossy(&made.stderr)
            );
        };
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let ca: Vec<&str> = ["req", "-x509", "-days", "2", "-subj", "/CN=lock-tests CA"]
            .into_iter()
            .chain(key)
            .chain(["-keyout", "ca.key", "-out", "ca.crt"])
            .chain(["-addext", "basicConstraints=critical,CA:TRUE"])
            .chain(["-addext", "keyUsage=critical,keyCertSign,cRLSign"])
            .collect();
        openssl(&ca);
        let request: Vec<&str> = ["req", "-subj", "/CN=127.0.0.1"]
            .into_iter()
            .chain(key)
            .chain(["-keyout", "server.key", "-out", "server.csr"])
            .collect();
        openssl(&request);
        // Servers connect to each other too (replication, the Cluster bus), as clients.
        std::fs::write(
            dir.join("server.ext"),
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write server.ext");
        openssl(&[
            "x509",
            "-req",
            "-days",
            "2",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ]);
        let pem = std::fs::read(dir.join("ca.crt")).expect("read ca.crt");
        TestCa { dir, pem }
    }

    /// What a client needs to trust the servers: this CA as its only root.
    pub fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(self.pem.clone()),
        }
    }

    /// What a client needs to trust the servers and show them a certificate this CA
    /// signed: the servers' own, which is signed for clients too.
    pub fn client_certificates(&self) -> redis::TlsCertificates {
        let read = |name: &str| std::fs::read(self.dir.join(name)).expect("read a certificate");
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: read("server.crt"),
                client_key: read("server.key"),
            }),
            root_cert: Some(self.pem.clone()),
        }
    }

    /// The path of the CA's certificate (`ca.crt`), for `redis-cli --cacert`.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// The `redis-server` arguments that make it serve TLS with these certificates,
    /// to clients and to the servers it replicates from.
    pub(crate) fn server_args(&self) -> Vec<String> {
        [
            ("--tls-cert-file", self.file("server.crt")),
            ("--tls-key-file", self.file("server.key")),
            ("--tls-ca-cert-file", self.file("ca.crt")),
            ("--tls-auth-clients", "no".to_owned()),
            ("--tls-replication", "yes".to_owned()),
        ]
        .into_iter()
        .flat_map(|(option, value)| [option.to_owned(), value])
        .collect()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestCa {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
