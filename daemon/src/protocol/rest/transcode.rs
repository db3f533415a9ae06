//! A REST request into its method's protobuf request, and a protobuf response or a gRPC status
//! into the REST answer: the proto3 JSON mapping (prost-reflect's), the path's variables and
//! the query's parameters set as `google.api.http` says, and Google's JSON error body.

use super::routes::{BodyField, Route};
use prost::Message;
use prost_reflect::{DynamicMessage, Kind, MessageDescriptor, ReflectMessage, Value};

/// The request message of `route`, in protobuf, from the request's JSON `body`, the fields its
/// path bound and its `query` (without the `?`). A refusal is INVALID_ARGUMENT's message.
pub fn request_of(
    route: &Route,
    body: &[u8],
    bound: &[(String, String)],
    query: Option<&str>,
) -> Result<Vec<u8>, String> {
    let descriptor = route.method.input();
    let mut message = match &route.body {
        BodyField::None => DynamicMessage::new(descriptor.clone()),
        BodyField::Whole => from_json(descriptor.clone(), body)?,
        BodyField::Field(field) => {
            let mut message = DynamicMessage::new(descriptor.clone());
            let field = descriptor.get_field_by_name(field).ok_or_else(|| format!("no field {field}"))?;
            let value = match field.kind() {
                Kind::Message(inner) => Value::Message(from_json(inner, body)?),
                _ => return Err(format!("the body field {} is not a message", field.name())),
            };
            message.set_field(&field, value);
            message
        }
    };
    // Fields neither the body nor the path sets come from the query (`?pageSize=10`).
    if route.body != BodyField::Whole {
        if let Some(query) = query.filter(|query| !query.is_empty()) {
            let parameters = from_json(descriptor.clone(), &query_json(&descriptor, query)?)?;
            message.merge(parameters.encode_to_vec().as_slice()).map_err(|error| error.to_string())?;
        }
    }
    for (path, value) in bound {
        set_path(&mut message, path, value)?;
    }
    Ok(message.encode_to_vec())
}

/// `descriptor`'s message from JSON (an empty body is the empty message); unknown fields are
/// refused, as Google's front end refuses them.
fn from_json(descriptor: MessageDescriptor, json: &[u8]) -> Result<DynamicMessage, String> {
    if json.iter().all(u8::is_ascii_whitespace) {
        return Ok(DynamicMessage::new(descriptor));
    }
    let mut deserializer = serde_json::Deserializer::from_slice(json);
    let message = DynamicMessage::deserialize(descriptor, &mut deserializer)
        .map_err(|error| format!("Invalid JSON payload received. {error}"))?;
    deserializer.end().map_err(|error| format!("Invalid JSON payload received. {error}"))?;
    Ok(message)
}

/// The query's parameters as the JSON of the request message: `a.b=1` as `{"a": {"b": 1}}`, a
/// repeated field's values as a list, each value typed by its field.
fn query_json(descriptor: &MessageDescriptor, query: &str) -> Result<Vec<u8>, String> {
    let mut object = serde_json::Map::new();
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        let (name, value) = (query_decode(name), query_decode(value));
        if is_system_parameter(&name) {
            continue;
        }
        let mut message = descriptor.clone();
        let mut target = &mut object;
        let mut names = name.split('.').peekable();
        while let Some(part) = names.next() {
            let field = message
                .get_field_by_json_name(part)
                .or_else(|| message.get_field_by_name(part))
                .ok_or_else(|| format!("Invalid query parameter: {name}"))?;
            let key = field.json_name().to_owned();
            if names.peek().is_none() {
                let typed = match field.kind() {
                    Kind::String | Kind::Bytes | Kind::Enum(_) => serde_json::Value::String(value.clone()),
                    _ => serde_json::from_str(&value).unwrap_or(serde_json::Value::String(value.clone())),
                };
                if field.is_list() {
                    let list = target.entry(key).or_insert_with(|| serde_json::Value::Array(Vec::new()));
                    if let serde_json::Value::Array(list) = list {
                        list.push(typed);
                    }
                } else {
                    target.insert(key, typed);
                }
                break;
            }
            let Kind::Message(inner) = field.kind() else {
                return Err(format!("Invalid query parameter: {name}"));
            };
            message = inner;
            let entry =
                target.entry(key).or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
            target = match entry {
                serde_json::Value::Object(inner) => inner,
                _ => return Err(format!("Invalid query parameter: {name}")),
            };
        }
    }
    serde_json::to_vec(&object).map_err(|error| error.to_string())
}

/// Whether a query parameter is one of Google's system parameters, which every method takes
/// and no request message holds (`$alt=json;enum-encoding=int`, as Google's Node client sends):
/// the answer is JSON whatever they say, enums by name (which clients read as well as numbers).
fn is_system_parameter(name: &str) -> bool {
    const SYSTEM_PARAMETERS: [&str; 9] = [
        "alt",
        "prettyPrint",
        "key",
        "fields",
        "quotaUser",
        "access_token",
        "callback",
        "upload_protocol",
        "uploadType",
    ];
    name.starts_with('$') || SYSTEM_PARAMETERS.contains(&name)
}

/// A query's `+` and `%XX` decoded.
fn query_decode(text: &str) -> String {
    super::routes::percent_decode(&text.replace('+', " "))
}

/// Sets the string field at the dotted `path` (`subscription.name`) to `value`.
fn set_path(message: &mut DynamicMessage, path: &str, value: &str) -> Result<(), String> {
    let (first, rest) = match path.split_once('.') {
        Some((first, rest)) => (first, Some(rest)),
        None => (path, None),
    };
    let field = message.descriptor().get_field_by_name(first).ok_or_else(|| format!("no field {path}"))?;
    match rest {
        None => {
            (field.kind() == Kind::String).then_some(()).ok_or_else(|| format!("{path} is not a string"))?;
            message.set_field(&field, Value::String(value.to_owned()));
            Ok(())
        }
        Some(rest) => match message.get_field_mut(&field) {
            Value::Message(inner) => set_path(inner, rest, value),
            _ => Err(format!("{first} is not a message")),
        },
    }
}

/// The JSON of a protobuf response of `route`'s method, in lowerCamelCase with bytes in
/// base64 and 64-bit integers, durations and timestamps as strings.
pub fn response_json(route: &Route, encoded: &[u8]) -> Result<Vec<u8>, String> {
    let message =
        DynamicMessage::decode(route.method.output(), encoded).map_err(|error| error.to_string())?;
    let mut json = Vec::new();
    let mut serializer = serde_json::Serializer::new(&mut json);
    message
        .serialize_with_options(&mut serializer, &prost_reflect::SerializeOptions::new())
        .map_err(|error| error.to_string())?;
    Ok(json)
}

/// A gRPC status code's HTTP status and name, as Google's REST front end maps them.
pub fn http_of(code: tonic::Code) -> (u16, &'static str) {
    use tonic::Code;
    match code {
        Code::Ok => (200, "OK"),
        Code::Cancelled => (499, "CANCELLED"),
        Code::Unknown => (500, "UNKNOWN"),
        Code::InvalidArgument => (400, "INVALID_ARGUMENT"),
        Code::DeadlineExceeded => (504, "DEADLINE_EXCEEDED"),
        Code::NotFound => (404, "NOT_FOUND"),
        Code::AlreadyExists => (409, "ALREADY_EXISTS"),
        Code::PermissionDenied => (403, "PERMISSION_DENIED"),
        Code::ResourceExhausted => (429, "RESOURCE_EXHAUSTED"),
        Code::FailedPrecondition => (400, "FAILED_PRECONDITION"),
        Code::Aborted => (409, "ABORTED"),
        Code::OutOfRange => (400, "OUT_OF_RANGE"),
        Code::Unimplemented => (501, "UNIMPLEMENTED"),
        Code::Internal => (500, "INTERNAL"),
        Code::Unavailable => (503, "UNAVAILABLE"),
        Code::DataLoss => (500, "DATA_LOSS"),
        Code::Unauthenticated => (401, "UNAUTHENTICATED"),
    }
}

/// Google's JSON error body for `code` and `message`, and its HTTP status.
pub fn error_json(code: tonic::Code, message: &str) -> (u16, Vec<u8>) {
    let (http, status) = http_of(code);
    let body = serde_json::json!({ "error": { "code": http, "message": message, "status": status } });
    (http, body.to_string().into_bytes())
}

#[cfg(test)]
mod tests {
    use super::super::routes::RouteTable;
    use super::*;

    fn route(table: &RouteTable, verb: http::Method, path: &str) -> (Route, Vec<(String, String)>) {
        let (route, bound) = table.find(&verb, path).unwrap();
        (route.clone(), bound)
    }

    #[test]
    fn a_publish_body_decodes_with_its_path_and_base64() {
        use ringpost_proto::pubsub::PublishRequest;
        let table = RouteTable::of_the_protos().unwrap();
        let (publish, bound) = route(&table, http::Method::POST, "/v1/projects/p/topics/t:publish");
        let body = br#"{"messages": [{"data": "aGVsbG8=", "attributes": {"k": "v"}, "orderingKey": "o"}]}"#;
        let encoded = request_of(&publish, body, &bound, None).unwrap();
        let request = PublishRequest::decode(encoded.as_slice()).unwrap();
        assert_eq!(request.topic, "projects/p/topics/t");
        assert_eq!(&request.messages[0].data[..], b"hello");
        assert_eq!(request.messages[0].attributes["k"], "v");
        assert_eq!(request.messages[0].ordering_key, "o");
        let malformed = request_of(&publish, b"{\"messages\": [", &bound, None).unwrap_err();
        assert!(malformed.starts_with("Invalid JSON payload"), "{malformed}");
        let unknown = request_of(&publish, b"{\"nonsense\": 1}", &bound, None).unwrap_err();
        assert!(unknown.contains("nonsense"), "{unknown}");
    }

    #[test]
    fn a_list_takes_its_query_and_a_patch_its_nested_name() {
        use ringpost_proto::pubsub::{ListTopicsRequest, UpdateSubscriptionRequest};
        let table = RouteTable::of_the_protos().unwrap();
        let (list, bound) = route(&table, http::Method::GET, "/v1/projects/p/topics");
        let encoded = request_of(&list, b"", &bound, Some("pageSize=2&pageToken=a%2Bb")).unwrap();
        let request = ListTopicsRequest::decode(encoded.as_slice()).unwrap();
        assert_eq!(
            (request.project.as_str(), request.page_size, request.page_token.as_str()),
            ("projects/p", 2, "a+b")
        );
        assert!(request_of(&list, b"", &bound, Some("noSuchField=1")).is_err());
        let system = Some("$alt=json%3Benum-encoding%3Dint&prettyPrint=false&pageSize=3");
        let request =
            ListTopicsRequest::decode(request_of(&list, b"", &bound, system).unwrap().as_slice()).unwrap();
        assert_eq!(request.page_size, 3, "system parameters are no fields");
        let (patch, bound) = route(&table, http::Method::PATCH, "/v1/projects/p/subscriptions/s");
        let body = br#"{"subscription": {"ackDeadlineSeconds": 30}, "updateMask": "ackDeadlineSeconds"}"#;
        let encoded = request_of(&patch, body, &bound, None).unwrap();
        let request = UpdateSubscriptionRequest::decode(encoded.as_slice()).unwrap();
        let subscription = request.subscription.unwrap();
        assert_eq!(subscription.name, "projects/p/subscriptions/s");
        assert_eq!(subscription.ack_deadline_seconds, 30);
        assert_eq!(request.update_mask.unwrap().paths, vec!["ack_deadline_seconds".to_owned()]);
    }

    #[test]
    fn a_response_is_lower_camel_case_json_and_an_error_googles_body() {
        use ringpost_proto::pubsub::{PublishResponse, Subscription};
        let table = RouteTable::of_the_protos().unwrap();
        let (publish, _) = route(&table, http::Method::POST, "/v1/projects/p/topics/t:publish");
        let response = PublishResponse { message_ids: vec!["1".into()] };
        let json = response_json(&publish, &response.encode_to_vec()).unwrap();
        assert_eq!(String::from_utf8(json).unwrap(), r#"{"messageIds":["1"]}"#);
        let (get, _) = route(&table, http::Method::GET, "/v1/projects/p/subscriptions/s");
        let subscription = Subscription { name: "n".into(), ack_deadline_seconds: 10, ..Default::default() };
        let json = String::from_utf8(response_json(&get, &subscription.encode_to_vec()).unwrap()).unwrap();
        assert!(json.contains(r#""ackDeadlineSeconds":10"#), "{json}");
        let (http, body) = error_json(tonic::Code::NotFound, "no topic");
        assert_eq!(http, 404);
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"error": {"code": 404, "message": "no topic", "status": "NOT_FOUND"}})
        );
    }
}
