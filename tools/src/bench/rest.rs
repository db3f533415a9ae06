//! The publish workload through Google Cloud Pub/Sub's REST interface (`ringpost-bench --rest`):
//! each publish is a `POST /v1/projects/P/topics/T:publish` with a JSON body, the messages'
//! data in base64, as the PHP client, the Node client's `fallback: 'rest'` and curl send it.
//! Topics are still made through the router's native protocol, as with `--grpc`, so the
//! figures differ only in how the publishes travel.
//!
//! HTTP/1.1 carries one request at a time per connection, so a publisher with several requests
//! in flight holds that many keep-alive connections: hyper's pooled client opens one when every
//! idle one is busy, and keeps it for the next request.

use super::grpc::PROJECT;
use crate::json;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use ringpost_client::{Error, Message};
use ringpost_wire::{ErrorCode, Status};

/// One publisher's pool of HTTP/1.1 connections to the REST interface.
#[derive(Clone)]
pub struct RestClient {
    client: Client<HttpConnector, Full<Bytes>>,
    address: String,
    token: Option<String>,
}

impl RestClient {
    /// A client of the REST interface at `address` (HOST:PORT, plaintext); it connects on its
    /// first request.
    pub fn connect(address: &str, token: Option<&str>) -> RestClient {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        // Built on the bench's tokio runtime, whose threads carry the connections.
        let _entered = super::grpc::runtime().enter();
        let client = Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector);
        RestClient { client, address: address.to_owned(), token: token.map(str::to_owned) }
    }

    /// Publishes `messages` to `topic` (Ringpost's name); their message ids, in order.
    pub async fn publish(&self, topic: &str, messages: Vec<Message>) -> Result<Vec<u64>, Error> {
        let body = publish_body(&messages);
        let mut request = hyper::Request::post(format!(
            "http://{}/v1/projects/{PROJECT}/topics/{topic}:publish",
            self.address
        ))
        .header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|error| Error::Protocol(format!("building a REST request: {error}")))?;
        let client = self.client.clone();
        // hyper's client runs on the runtime's threads; the bench's poller awaits its answer.
        let answer = super::grpc::runtime().spawn(async move {
            let response = client.request(request).await.map_err(|error| error.to_string())?;
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.map_err(|error| error.to_string())?;
            Ok::<_, String>((status, body.to_bytes()))
        });
        let (status, body) = answer
            .await
            .map_err(|error| Error::Closed(format!("the REST request's task: {error}")))?
            .map_err(|error| Error::Closed(format!("{} (REST): {error}", self.address)))?;
        let text = std::str::from_utf8(&body)
            .map_err(|_| Error::Protocol("a REST answer that is not UTF-8".to_owned()))?;
        if status != 200 {
            return Err(Error::Status(error_status(status, text)));
        }
        message_ids(text)
    }
}

/// The JSON body of a publish of `messages`.
fn publish_body(messages: &[Message]) -> String {
    let mut body = String::from("{\"messages\":[");
    for (index, Message(message)) in messages.iter().enumerate() {
        if index > 0 {
            body.push(',');
        }
        // Base64 needs no escaping: quoted as it is.
        let mut fields = vec![("data", format!("\"{}\"", json::base64(&message.data)))];
        if !message.attributes.is_empty() {
            let attributes: Vec<(&str, String)> = message
                .attributes
                .iter()
                .map(|pair| (pair.key.as_str(), json::string(&pair.value)))
                .collect();
            fields.push(("attributes", json::object(&attributes)));
        }
        if !message.ordering_key.is_empty() {
            fields.push(("orderingKey", json::string(&message.ordering_key)));
        }
        body.push_str(&json::object(&fields));
    }
    body.push_str("]}");
    body
}

/// The ids of a publish's answer, `{"messageIds": ["1", "2"]}`.
fn message_ids(text: &str) -> Result<Vec<u64>, Error> {
    let malformed = || Error::Protocol(format!("a REST publish answered {text:?}"));
    let json::Value::Object(fields) = json::parse(text).map_err(|_| malformed())? else {
        return Err(malformed());
    };
    let Some((_, json::Value::Array(ids))) = fields.iter().find(|(name, _)| name == "messageIds") else {
        return Err(malformed());
    };
    ids.iter()
        .map(|id| match id {
            json::Value::String(id) => id.parse().map_err(|_| malformed()),
            _ => Err(malformed()),
        })
        .collect()
}

/// Google's error body, `{"error": {"code", "message", "status"}}`, as the native client's
/// status, so the workloads report both alike.
fn error_status(http_status: u16, text: &str) -> Status {
    let error = match json::parse(text) {
        Ok(json::Value::Object(fields)) => {
            fields.into_iter().find(|(name, _)| name == "error").map(|(_, value)| value)
        }
        _ => None,
    };
    let field = |name: &str| match &error {
        Some(json::Value::Object(fields)) => {
            fields.iter().find(|(field, _)| field == name).map(|(_, value)| value.clone())
        }
        _ => None,
    };
    let code = match field("status") {
        Some(json::Value::String(status)) => grpc_code(&status),
        _ => ErrorCode::Unknown,
    };
    let message = match field("message") {
        Some(json::Value::String(message)) => message,
        _ => format!("HTTP {http_status}: {text}"),
    };
    Status::new(code, message)
}

/// The gRPC code Google's error body names in words.
fn grpc_code(status: &str) -> ErrorCode {
    let number = match status {
        "CANCELLED" => 1,
        "INVALID_ARGUMENT" => 3,
        "DEADLINE_EXCEEDED" => 4,
        "NOT_FOUND" => 5,
        "ALREADY_EXISTS" => 6,
        "PERMISSION_DENIED" => 7,
        "RESOURCE_EXHAUSTED" => 8,
        "FAILED_PRECONDITION" => 9,
        "ABORTED" => 10,
        "OUT_OF_RANGE" => 11,
        "UNIMPLEMENTED" => 12,
        "INTERNAL" => 13,
        "UNAVAILABLE" => 14,
        "UNAUTHENTICATED" => 16,
        _ => 2,
    };
    ErrorCode::from_u32(number).unwrap_or(ErrorCode::Unknown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_publish_body_is_google_json_with_base64_data() {
        let mut message = ringpost_wire::messages::PubsubMessage {
            data: b"hi!".to_vec(),
            attributes: vec![ringpost_wire::messages::Attribute { key: "k".into(), value: "v".into() }],
            ordering_key: "key".into(),
        };
        let body = publish_body(&[Message(message.clone())]);
        assert_eq!(body, r#"{"messages":[{"data":"aGkh","attributes":{"k":"v"},"orderingKey":"key"}]}"#);
        message.attributes.clear();
        message.ordering_key.clear();
        assert_eq!(
            publish_body(&[Message(message.clone()), Message(message)]),
            r#"{"messages":[{"data":"aGkh"},{"data":"aGkh"}]}"#
        );
    }

    #[test]
    fn an_answer_gives_its_ids_or_googles_error() {
        assert_eq!(message_ids(r#"{"messageIds": ["7", "8"]}"#).unwrap(), vec![7, 8]);
        assert!(message_ids(r#"{"messageIds": [7]}"#).is_err());
        assert!(message_ids("{}").is_err());
        let status = error_status(
            404,
            r#"{"error": {"code": 404, "message": "Resource not found (resource=t).", "status": "NOT_FOUND"}}"#,
        );
        assert_eq!(status.code, ErrorCode::NotFound);
        assert_eq!(status.message, "Resource not found (resource=t).");
        assert_eq!(error_status(502, "bad gateway").code, ErrorCode::Unknown);
    }
}
