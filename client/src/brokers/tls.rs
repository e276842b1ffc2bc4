//! The TLS files of a broker connection, set the same way on every publisher builder that
//! speaks TLS through a Rust client (Redis, NATS, RabbitMQ, the webhook, MQTT): a CA, and
//! a client certificate with its key, all PEM files.
//!
//! Kafka is the exception: librdkafka reads its own properties (`ssl.ca.location`,
//! `ssl.certificate.location`, `ssl.key.location`), set with `KafkaPublisherBuilder::set`
//! as every Kafka client documents them.
//!
//! Files are read by `build()`, so a missing or unreadable one is a configuration error
//! at start-up that names the file, not a failed publish later.

use std::path::{Path, PathBuf};

use crate::ClientError;

/// Which TLS files a publisher uses.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    /// The CA that signed the broker's certificate, for a broker whose certificate the
    /// system's roots do not cover (a private CA).
    pub ca: Option<PathBuf>,
    /// A client certificate and its private key, for brokers that authenticate clients by
    /// certificate (mutual TLS).
    pub client: Option<(PathBuf, PathBuf)>,
}

/// The contents of [`TlsFiles`], read.
#[derive(Debug, Clone, Default)]
#[allow(dead_code)] // each field is used by the publishers of some features only
pub(crate) struct TlsPem {
    pub ca: Option<Vec<u8>>,
    /// The client certificate (PEM) and its key (PEM).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl TlsFiles {
    /// Whether any file is set.
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }

    /// Reads every file set; an error names the file and what it was for.
    #[allow(dead_code)] // used by the publishers' modules, each behind its feature
    pub(crate) fn read(&self) -> Result<TlsPem, ClientError> {
        let ca = self
            .ca
            .as_deref()
            .map(|path| read(path, "CA certificate"))
            .transpose()?;
        let client = match &self.client {
            Some((cert, key)) => Some((
                read(cert, "client certificate")?,
                read(key, "client certificate's key")?,
            )),
            None => None,
        };
        Ok(TlsPem { ca, client })
    }
}

fn read(path: &Path, what: &str) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|error| {
        ClientError::Config(format!(
            "cannot read the {what} {}: {error}; give the path of a PEM file",
            path.display()
        ))
    })
}

/// The TLS methods of a publisher builder with a `tls: TlsFiles` field.
#[allow(unused_macros)] // used by the publishers' modules, each behind its feature
macro_rules! tls_methods {
    () => {
        /// Trusts the CA certificate in this PEM file for the broker's certificate (a
        /// private CA); read by `build()`.
        pub fn tls_ca(mut self, path: impl Into<std::path::PathBuf>) -> Self {
            self.tls.ca = Some(path.into());
            self
        }

        /// Presents this client certificate (PEM) with its private key (PEM, PKCS#8, PKCS#1
        /// or SEC1) to a broker that authenticates clients by certificate; read by
        /// `build()`.
        pub fn tls_client_cert(
            mut self,
            cert: impl Into<std::path::PathBuf>,
            key: impl Into<std::path::PathBuf>,
        ) -> Self {
            self.tls.client = Some((cert.into(), key.into()));
            self
        }

        /// Sets every TLS file at once.
        pub fn tls(mut self, files: $crate::brokers::TlsFiles) -> Self {
            self.tls = files;
            self
        }
    };
}
#[allow(unused_imports)] // used by the publishers' modules, each behind its feature
pub(crate) use tls_methods;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_named() {
        let files = TlsFiles {
            ca: Some("/nonexistent/ca.pem".into()),
            client: None,
        };
        let error = files.read().unwrap_err().to_string();
        assert!(
            error.contains("CA certificate /nonexistent/ca.pem"),
            "{error}"
        );
    }
}
