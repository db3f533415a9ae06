//! The REST API's route table, read from the `google.api.http` annotations of the protos'
//! services: each unary method's verb, path template and body field. Nothing here is written
//! per method, so a service implemented later (SchemaService) gets its routes with no change.

use prost_reflect::{DescriptorPool, DynamicMessage, MethodDescriptor, Value};

/// One segment of a path template, or of a variable's pattern.
#[derive(Debug, Clone, PartialEq)]
enum Pattern {
    Literal(String),
    /// `*`: one segment.
    One,
    /// `**`: the segments left (at least one).
    Rest,
}

/// A path template's segment: a literal, or a variable binding a request field (a dotted path)
/// to the segments its pattern matches.
#[derive(Debug, Clone, PartialEq)]
enum Segment {
    Literal(String),
    Variable { field: String, pattern: Vec<Pattern> },
}

/// A parsed path template, as `/v1/{topic=projects/*/topics/*}:publish`.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    segments: Vec<Segment>,
    /// The custom verb after the last segment (`publish`), if any.
    verb: Option<String>,
}

/// Where a request's JSON body goes.
#[derive(Debug, Clone, PartialEq)]
pub enum BodyField {
    /// No body (GET, DELETE): fields not in the path come from the query.
    None,
    /// `body: "*"`: the whole request message.
    Whole,
    /// `body: "field"`: that field of the request message.
    Field(String),
}

/// One HTTP binding of a method.
#[derive(Debug, Clone)]
pub struct Route {
    pub verb: http::Method,
    pub template: Template,
    pub body: BodyField,
    pub method: MethodDescriptor,
    /// The method's gRPC path (`/google.pubsub.v1.Publisher/Publish`).
    pub grpc_path: String,
}

/// Every unary method's bindings, in the order of the protos.
pub struct RouteTable {
    pub routes: Vec<Route>,
}

impl Template {
    /// Parses a template of the `google.api.http` syntax (`/v1/{name=projects/*}/topics`).
    pub fn parse(text: &str) -> Result<Template, String> {
        let path = text.strip_prefix('/').ok_or_else(|| format!("{text}: a template starts with /"))?;
        // The verb follows the last segment: after the last `}` or `/`, whichever is later.
        let last = path.rfind(['}', '/']).map_or(0, |at| at + 1);
        let (path, verb) = match path[last..].find(':') {
            Some(colon) => (&path[..last + colon], Some(path[last + colon + 1..].to_owned())),
            None => (path, None),
        };
        let mut segments = Vec::new();
        let mut rest = path;
        while !rest.is_empty() {
            if let Some(variable) = rest.strip_prefix('{') {
                let end = variable.find('}').ok_or_else(|| format!("{text}: an unclosed variable"))?;
                let (field, pattern) = match variable[..end].split_once('=') {
                    Some((field, pattern)) => (field, pattern.split('/').map(Pattern::parse).collect()),
                    None => (&variable[..end], vec![Pattern::One]),
                };
                segments.push(Segment::Variable { field: field.to_owned(), pattern });
                rest = variable[end + 1..].strip_prefix('/').unwrap_or(&variable[end + 1..]);
            } else {
                let (segment, after) = rest.split_once('/').unwrap_or((rest, ""));
                segments.push(Segment::Literal(segment.to_owned()));
                rest = after;
            }
        }
        Ok(Template { segments, verb })
    }

    /// The fields `path` binds (field path, value), if it matches; `path` is the request's,
    /// with its leading `/` and without its query.
    pub fn matches(&self, path: &str) -> Option<Vec<(String, String)>> {
        let path = path.strip_prefix('/')?;
        let path = match &self.verb {
            Some(verb) => path.strip_suffix(verb.as_str())?.strip_suffix(':')?,
            None => path,
        };
        let parts: Vec<&str> = path.split('/').collect();
        let mut at = 0;
        let mut bound = Vec::new();
        for (index, segment) in self.segments.iter().enumerate() {
            match segment {
                Segment::Literal(literal) => {
                    (parts.get(at) == Some(&literal.as_str())).then_some(())?;
                    at += 1;
                }
                Segment::Variable { field, pattern } => {
                    // A `**` takes what the segments after this variable leave.
                    let after = self.segments[index + 1..].len();
                    let start = at;
                    for piece in pattern {
                        match piece {
                            Pattern::Literal(literal) => {
                                (parts.get(at) == Some(&literal.as_str())).then_some(())?
                            }
                            Pattern::One => (!parts.get(at)?.is_empty()).then_some(())?,
                            Pattern::Rest => at = parts.len().checked_sub(after + 1)?.max(at),
                        }
                        at += 1;
                    }
                    (at <= parts.len()).then_some(())?;
                    let value = parts[start..at].iter().map(|part| percent_decode(part)).collect::<Vec<_>>();
                    bound.push((field.clone(), value.join("/")));
                }
            }
        }
        (at == parts.len()).then_some(bound)
    }
}

impl Pattern {
    fn parse(text: &str) -> Pattern {
        match text {
            "*" => Pattern::One,
            "**" => Pattern::Rest,
            literal => Pattern::Literal(literal.to_owned()),
        }
    }
}

/// `%XX` escapes decoded (a malformed one is left as it is).
pub fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = (bytes[at] == b'%')
            .then(|| text.get(at + 1..at + 3).and_then(|hex| u8::from_str_radix(hex, 16).ok()))
            .flatten();
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                at += 3;
            }
            None => {
                decoded.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

impl RouteTable {
    /// The bindings of every unary method of every service in `pool` that has a `google.api.http`
    /// annotation (streaming methods have none in Pub/Sub's protos, and are skipped if given one).
    pub fn from_pool(pool: &DescriptorPool) -> Result<RouteTable, String> {
        let extension = pool
            .get_extension_by_name("google.api.http")
            .ok_or("the descriptors have no google.api.http extension")?;
        let mut routes = Vec::new();
        for service in pool.services() {
            for method in service.methods() {
                let options = method.options();
                if method.is_client_streaming()
                    || method.is_server_streaming()
                    || !options.has_extension(&extension)
                {
                    continue;
                }
                let grpc_path = format!("/{}/{}", service.full_name(), method.name());
                if let Value::Message(rule) = options.get_extension(&extension).as_ref() {
                    add_rule(&mut routes, rule, &method, &grpc_path)?;
                }
            }
        }
        Ok(RouteTable { routes })
    }

    /// The table of the protos compiled into `ringpost_proto`.
    pub fn of_the_protos() -> Result<RouteTable, String> {
        let pool = DescriptorPool::decode(ringpost_proto::FILE_DESCRIPTOR_SET)
            .map_err(|error| format!("the protos' descriptors: {error}"))?;
        RouteTable::from_pool(&pool)
    }

    /// The route `verb` and `path` reach, and the fields its path binds.
    pub fn find(&self, verb: &http::Method, path: &str) -> Option<(&Route, Vec<(String, String)>)> {
        self.routes
            .iter()
            .filter(|route| route.verb == verb)
            .find_map(|route| route.template.matches(path).map(|bound| (route, bound)))
    }
}

/// Adds an `HttpRule`'s binding and its `additional_bindings`.
fn add_rule(
    routes: &mut Vec<Route>,
    rule: &DynamicMessage,
    method: &MethodDescriptor,
    grpc_path: &str,
) -> Result<(), String> {
    let text = |name: &str| match rule.get_field_by_name(name).as_deref() {
        Some(Value::String(text)) if !text.is_empty() => Some(text.clone()),
        _ => None,
    };
    let verbs = [
        ("get", http::Method::GET),
        ("put", http::Method::PUT),
        ("post", http::Method::POST),
        ("delete", http::Method::DELETE),
        ("patch", http::Method::PATCH),
    ];
    if let Some((verb, template)) = verbs.iter().find_map(|(name, verb)| text(name).map(|path| (verb, path)))
    {
        let body = match text("body").as_deref() {
            None => BodyField::None,
            Some("*") => BodyField::Whole,
            Some(field) => BodyField::Field(field.to_owned()),
        };
        let template =
            Template::parse(&template).map_err(|error| format!("{}: {error}", method.full_name()))?;
        routes.push(Route {
            verb: verb.clone(),
            template,
            body,
            method: method.clone(),
            grpc_path: grpc_path.to_owned(),
        });
    }
    if let Some(Value::List(more)) = rule.get_field_by_name("additional_bindings").as_deref() {
        for binding in more {
            if let Value::Message(binding) = binding {
                add_rule(routes, binding, method, grpc_path)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_binds_its_variables_and_verb() {
        let publish = Template::parse("/v1/{topic=projects/*/topics/*}:publish").unwrap();
        assert_eq!(
            publish.matches("/v1/projects/p/topics/t:publish"),
            Some(vec![("topic".to_owned(), "projects/p/topics/t".to_owned())])
        );
        assert_eq!(publish.matches("/v1/projects/p/topics/t"), None, "no verb");
        assert_eq!(publish.matches("/v1/projects/p/topics/t:pull"), None, "another verb");
        assert_eq!(publish.matches("/v1/projects/p/subscriptions/t:publish"), None);
        assert_eq!(publish.matches("/v1/projects/p/topics/t/x:publish"), None, "a segment too many");
        let list = Template::parse("/v1/{project=projects/*}/topics").unwrap();
        assert_eq!(
            list.matches("/v1/projects/p/topics"),
            Some(vec![("project".to_owned(), "projects/p".to_owned())])
        );
        assert_eq!(list.matches("/v1/projects//topics"), None, "an empty segment");
        let nested = Template::parse("/v1/{subscription.name=projects/*/subscriptions/*}").unwrap();
        assert_eq!(
            nested.matches("/v1/projects/p/subscriptions/s%2Db"),
            Some(vec![("subscription.name".to_owned(), "projects/p/subscriptions/s-b".to_owned())])
        );
        let rest = Template::parse("/v1/{name=**}/x").unwrap();
        assert_eq!(rest.matches("/v1/a/b/c/x"), Some(vec![("name".to_owned(), "a/b/c".to_owned())]));
    }

    /// Every unary Publisher and Subscriber method has a route, from the annotations alone.
    #[test]
    fn the_protos_give_every_unary_method_a_route() {
        let table = RouteTable::of_the_protos().unwrap();
        let paths: Vec<&str> = table.routes.iter().map(|route| route.grpc_path.as_str()).collect();
        for method in ["Publisher/CreateTopic", "Publisher/Publish", "Subscriber/Pull", "Subscriber/Seek"] {
            assert!(paths.contains(&format!("/google.pubsub.v1.{method}").as_str()), "{method}: {paths:?}");
        }
        assert!(!paths.iter().any(|path| path.ends_with("/StreamingPull")), "a stream has no route");
        let (route, bound) =
            table.find(&http::Method::POST, "/v1/projects/p/subscriptions/s:acknowledge").unwrap();
        assert_eq!(route.grpc_path, "/google.pubsub.v1.Subscriber/Acknowledge");
        assert_eq!(route.body, BodyField::Whole);
        assert_eq!(bound, vec![("subscription".to_owned(), "projects/p/subscriptions/s".to_owned())]);
        let (route, _) = table.find(&http::Method::PUT, "/v1/projects/p/topics/t").unwrap();
        assert_eq!(route.grpc_path, "/google.pubsub.v1.Publisher/CreateTopic");
        let (route, _) = table.find(&http::Method::GET, "/v1/projects/p/subscriptions").unwrap();
        assert_eq!(route.grpc_path, "/google.pubsub.v1.Subscriber/ListSubscriptions");
        // Every service's, not only these two: SchemaService's come with its implementation.
        let (route, _) = table.find(&http::Method::POST, "/v1/projects/p/schemas").unwrap();
        assert_eq!(route.grpc_path, "/google.pubsub.v1.SchemaService/CreateSchema");
    }
}
