//! moto in server mode, an emulator of AWS's APIs from PyPI, as the SQS and SNS tests'
//! AWS: one server per test (`tests/moto/server`, whose venv `scripts/test` makes first)
//! on a free port of 127.0.0.1, stopped by its pid when dropped; clients of the test's
//! own to create queues, topics and subscriptions and to read back what was published;
//! the environment the relay's standard credential chain finds.

use std::collections::BTreeMap;
use std::process::Stdio;

use tokio::process::{Child, Command};
use tokio::sync::Mutex;
use txoutbox_client::sns::aws_sdk_sns;
use txoutbox_client::sqs::aws_config::{BehaviorVersion, Region, SdkConfig};
use txoutbox_client::sqs::aws_sdk_sqs;
use txoutbox_client::sqs::aws_sdk_sqs::config::{Credentials, SharedCredentialsProvider};
use txoutbox_client::sqs::aws_sdk_sqs::types::{MessageSystemAttributeName, QueueAttributeName};

use crate::{eventually, free_port, DEADLINE};

/// The region of every test's resources.
pub const REGION: &str = "us-east-1";
/// moto takes any credentials; these are the tests'.
const KEY_ID: &str = "txoutbox-tests";
const SECRET: &str = "txoutbox-tests-secret";

pub struct Moto {
    pub port: u16,
    /// Behind a lock so that a test's `stop` and `start` closures can share the server.
    child: Mutex<Option<Child>>,
    /// moto's output, for a failed test's message.
    log: tempfile::NamedTempFile,
}

impl Moto {
    /// Starts moto and waits until it answers.
    pub async fn start() -> Self {
        let moto = Self {
            port: free_port(),
            child: Mutex::new(None),
            log: tempfile::NamedTempFile::new().unwrap(),
        };
        moto.start_again().await;
        moto
    }

    /// Starts moto (again, on the same port: with nothing in it, as moto keeps everything
    /// in memory) and waits until it answers.
    pub async fn start_again(&self) {
        let mut running = self.child.lock().await;
        assert!(running.is_none(), "moto already running");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/moto/server");
        let child = Command::new(script)
            .args(["-H", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::null())
            .stdout(self.log.reopen().unwrap())
            .stderr(self.log.reopen().unwrap())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{script}: {e}"));
        *running = Some(child);
        let url = format!("{}/moto-api/", self.endpoint());
        let client = reqwest::Client::new();
        eventually(
            &format!("moto answering on {url}"),
            DEADLINE * 4,
            || async { client.get(&url).send().await.ok().map(drop) },
        )
        .await;
    }

    /// SIGTERM to moto, by its pid (the script execs moto), then waits until it exited.
    pub async fn stop(&self) {
        let mut child = self.child.lock().await.take().expect("moto is running");
        let pid = child.id().expect("not yet waited for").to_string();
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {pid}");
        tokio::time::timeout(DEADLINE, child.wait())
            .await
            .expect("moto did not exit on SIGTERM")
            .unwrap();
    }

    /// `http://127.0.0.1:PORT`: the `--aws-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// What the relay's standard credential chain finds: the tests' keys and region,
    /// and no profile of the machine's.
    pub fn env() -> Vec<(&'static str, &'static str)> {
        vec![
            ("AWS_ACCESS_KEY_ID", KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            ("AWS_REGION", REGION),
            ("AWS_CONFIG_FILE", "/dev/null"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ]
    }

    /// An AWS configuration for moto: the tests' keys, the region, this endpoint.
    pub fn sdk_config(&self) -> SdkConfig {
        let http = aws_smithy_http_client::Builder::new().build_http();
        SdkConfig::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .endpoint_url(self.endpoint())
            .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
                KEY_ID, SECRET, None, None, "tests",
            )))
            .http_client(http)
            .build()
    }

    pub fn sqs(&self) -> aws_sdk_sqs::Client {
        aws_sdk_sqs::Client::new(&self.sdk_config())
    }

    pub fn sns(&self) -> aws_sdk_sns::Client {
        aws_sdk_sns::Client::new(&self.sdk_config())
    }

    /// Creates the queue `name` (FIFO if it ends with `.fifo`) with `attributes`;
    /// returns its URL.
    pub async fn queue(&self, name: &str, attributes: &[(QueueAttributeName, &str)]) -> String {
        let mut create = self.sqs().create_queue().queue_name(name);
        if name.ends_with(".fifo") {
            create = create.attributes(QueueAttributeName::FifoQueue, "true");
        }
        for (attribute, value) in attributes {
            create = create.attributes(attribute.clone(), *value);
        }
        let created = create.send().await.expect("create_queue");
        created.queue_url().unwrap().to_owned()
    }

    /// Creates the topic `name` (FIFO if it ends with `.fifo`) with the queue at
    /// `queue_url` subscribed with raw message delivery; returns the topic's ARN.
    pub async fn topic_to_queue(&self, name: &str, queue_url: &str) -> String {
        let queue_arn = self
            .sqs()
            .get_queue_attributes()
            .queue_url(queue_url)
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await
            .expect("get_queue_attributes")
            .attributes()
            .and_then(|attributes| attributes.get(&QueueAttributeName::QueueArn).cloned())
            .expect("the queue's ARN");
        let mut create = self.sns().create_topic().name(name);
        if name.ends_with(".fifo") {
            create = create.attributes("FifoTopic", "true");
        }
        let topic = create
            .send()
            .await
            .expect("create_topic")
            .topic_arn()
            .unwrap()
            .to_owned();
        self.sns()
            .subscribe()
            .topic_arn(&topic)
            .protocol("sqs")
            .endpoint(&queue_arn)
            .attributes("RawMessageDelivery", "true")
            .send()
            .await
            .expect("subscribe");
        topic
    }

    /// Receives (and deletes) messages from `queue_url` until `count` arrived, in the
    /// order SQS handed them out.
    pub async fn receive(&self, queue_url: &str, count: usize) -> Vec<Received> {
        let sqs = self.sqs();
        let mut received = Vec::new();
        let deadline = tokio::time::Instant::now() + DEADLINE;
        while received.len() < count {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {count} messages in {queue_url} within {DEADLINE:?}: {received:#?}\nmoto: {}",
                received.len(),
                self.log()
            );
            let answer = sqs
                .receive_message()
                .queue_url(queue_url)
                .max_number_of_messages(10)
                .wait_time_seconds(1)
                .message_attribute_names("All")
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .send()
                .await
                .expect("receive_message");
            for message in answer.messages() {
                sqs.delete_message()
                    .queue_url(queue_url)
                    .receipt_handle(message.receipt_handle().unwrap())
                    .send()
                    .await
                    .expect("delete_message");
                received.push(Received::from(message));
            }
        }
        received
    }

    /// How many requests moto has answered so far (one log line each).
    pub fn requests(&self) -> usize {
        self.log()
            .lines()
            .filter(|line| line.contains("\"POST "))
            .count()
    }

    /// moto's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        // By its pid (the script execs moto): this test's server only.
        if let Some(child) = self.child.get_mut().as_mut() {
            let _ = child.start_kill();
        }
    }
}

/// One SQS message as a consumer reads it.
#[derive(Debug, Clone)]
pub struct Received {
    pub body: String,
    /// String message attributes.
    pub attributes: BTreeMap<String, String>,
    /// FIFO: `MessageGroupId` and `MessageDeduplicationId`.
    pub group_id: Option<String>,
    pub deduplication_id: Option<String>,
}

impl From<&aws_sdk_sqs::types::Message> for Received {
    fn from(message: &aws_sdk_sqs::types::Message) -> Self {
        let attributes = message
            .message_attributes()
            .into_iter()
            .flatten()
            .map(|(name, value)| {
                let value = value.string_value().unwrap_or_default().to_owned();
                (name.clone(), value)
            })
            .collect();
        let system = message.attributes();
        let system = |name: MessageSystemAttributeName| {
            system.and_then(|attributes| attributes.get(&name)).cloned()
        };
        Self {
            body: message.body().unwrap_or_default().to_owned(),
            attributes,
            group_id: system(MessageSystemAttributeName::MessageGroupId),
            deduplication_id: system(MessageSystemAttributeName::MessageDeduplicationId),
        }
    }
}
