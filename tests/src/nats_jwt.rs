//! NATS decentralized authentication made by the test, as `nsc` would: an operator, an
//! account it signs (JetStream on), and a user the account signs, written as the user's
//! credentials file (`.creds`: the user JWT and its NKey seed). The server runs in
//! operator mode with the account preloaded ([`Operator::server_config`]).
//!
//! A JWT here is `base64url(header).base64url(claims).base64url(signature)`, the header
//! `{"typ":"JWT","alg":"ed25519-nkey"}`, signed by the issuer's NKey: the format
//! nats-server verifies (JWT v2 claims).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use nkeys::KeyPair;
use serde_json::{json, Value};

pub struct Operator {
    operator: KeyPair,
    account: KeyPair,
    /// The system account, without which JetStream does not start in operator mode.
    system: KeyPair,
    operator_jwt: String,
    account_jwt: String,
    system_jwt: String,
}

impl Operator {
    /// An operator and one account with JetStream and no limits.
    pub fn new() -> Self {
        let operator = KeyPair::new_operator();
        let account = KeyPair::new_account();
        let operator_jwt = sign(
            &operator,
            &operator.public_key(),
            "operator",
            json!({"type": "operator", "version": 2}),
        );
        let unlimited = json!({
            "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
            "wildcards": true, "conn": -1, "leaf": -1,
            "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
        });
        let account_jwt = sign(
            &operator,
            &account.public_key(),
            "orders",
            json!({
                "limits": unlimited,
                "default_permissions": {"pub": {}, "sub": {}},
                "type": "account",
                "version": 2,
            }),
        );
        let system = KeyPair::new_account();
        let system_jwt = sign(
            &operator,
            &system.public_key(),
            "SYS",
            json!({"type": "account", "version": 2}),
        );
        Self {
            operator,
            account,
            system,
            operator_jwt,
            account_jwt,
            system_jwt,
        }
    }

    /// The lines of a nats-server configuration for operator mode with the account
    /// preloaded (the operator's JWT written to `dir`).
    pub fn server_config(&self, dir: &Path) -> String {
        let operator = dir.join("operator.jwt");
        std::fs::write(&operator, &self.operator_jwt).unwrap();
        format!(
            "operator: \"{}\"\nsystem_account: {}\nresolver: MEMORY\n\
             resolver_preload: {{ {}: \"{}\", {}: \"{}\" }}\n",
            operator.display(),
            self.system.public_key(),
            self.account.public_key(),
            self.account_jwt,
            self.system.public_key(),
            self.system_jwt,
        )
    }

    /// A user, as its credentials file in `dir`: signed by the operator's account, or
    /// (`signed_by_account` false, to be refused) by an account the operator never signed.
    pub fn user_creds(&self, dir: &Path, name: &str, signed_by_account: bool) -> PathBuf {
        let user = KeyPair::new_user();
        let stranger = KeyPair::new_account();
        let signer = if signed_by_account {
            &self.account
        } else {
            &stranger
        };
        let jwt = sign(
            signer,
            &user.public_key(),
            name,
            json!({
                "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
                "type": "user", "version": 2,
            }),
        );
        let creds = format!(
            "-----BEGIN NATS USER JWT-----\n{jwt}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\
             NKEYs are sensitive and should be treated as secrets.\n\n\
             -----BEGIN USER NKEY SEED-----\n{}\n------END USER NKEY SEED------\n\n\
             *************************************************************\n",
            user.seed().unwrap()
        );
        let path = dir.join(format!("{name}.creds"));
        std::fs::write(&path, creds).unwrap();
        path
    }

    /// The operator's public key, for a failed test's message.
    pub fn public_key(&self) -> String {
        self.operator.public_key()
    }
}

impl Default for Operator {
    fn default() -> Self {
        Self::new()
    }
}

/// A JWT of `subject` named `name` with the `nats` claims, signed by `issuer`.
fn sign(issuer: &KeyPair, subject: &str, name: &str, nats: Value) -> String {
    let issued = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = json!({
        "jti": uuid::Uuid::new_v4().simple().to_string().to_uppercase(),
        "iat": issued,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    let header = URL_SAFE_NO_PAD.encode(r#"{"typ":"JWT","alg":"ed25519-nkey"}"#);
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let signature = issuer.sign(signed.as_bytes()).unwrap();
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
}
