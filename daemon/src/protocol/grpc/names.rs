//! Pub/Sub's resource names and how they map onto Ringpost's.
//!
//! Pub/Sub names a topic `projects/{project}/topics/{topic}`; Ringpost names it `{topic}`, the
//! same name the native protocol and the CLI use. A daemon is one namespace: every project
//! sees the same topics, subscriptions and snapshots, and a name is answered in the project
//! it was asked in. So `projects/a/topics/orders` and `projects/b/topics/orders` are the one
//! topic `orders`, and a message published to it by either protocol is delivered to a
//! subscriber of either. The project must still be a valid project id, so that a name Google
//! would refuse is refused here too.

use crate::api::control::validate_name;
use crate::api::Status;

/// The kinds of resource a name can point at, as Pub/Sub spells their collection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Topic,
    Subscription,
    Snapshot,
    Schema,
}

impl Kind {
    fn collection(self) -> &'static str {
        match self {
            Kind::Topic => "topics",
            Kind::Subscription => "subscriptions",
            Kind::Snapshot => "snapshots",
            Kind::Schema => "schemas",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::Topic => "topic",
            Kind::Subscription => "subscription",
            Kind::Snapshot => "snapshot",
            Kind::Schema => "schema",
        }
    }
}

/// A resource name, parsed: the project it was asked in, and Ringpost's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name {
    pub project: String,
    pub name: String,
}

/// `projects/{project}/{collection}/{name}` to its parts, checked with Pub/Sub's rules; the
/// error is Pub/Sub's: `INVALID_ARGUMENT` naming the field and what is wrong.
pub fn parse(field: &str, kind: Kind, text: &str) -> Result<Name, Status> {
    let invalid = |why: &str| {
        Status::invalid_argument(format!(
            "Invalid resource name given ({field}={text}): {why}; expected projects/{{project}}/{}/{{{}}}",
            kind.collection(),
            kind.noun()
        ))
    };
    let mut parts = text.split('/');
    let (Some("projects"), Some(project), Some(collection), Some(name), None) =
        (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(invalid("not a resource name"));
    };
    if collection != kind.collection() {
        return Err(invalid(&format!("'{collection}' is not '{}'", kind.collection())));
    }
    validate_project(project).map_err(|why| invalid(&why))?;
    validate_name(kind.noun(), name).map_err(|status| invalid(&status.message))?;
    Ok(Name { project: project.to_owned(), name: name.to_owned() })
}

/// `projects/{project}`, as list requests name their project.
pub fn parse_project(field: &str, text: &str) -> Result<String, Status> {
    let project =
        text.strip_prefix("projects/").filter(|project| !project.contains('/')).ok_or_else(|| {
            Status::invalid_argument(format!(
                "Invalid resource name given ({field}={text}): expected projects/{{project}}"
            ))
        })?;
    validate_project(project).map_err(|why| {
        Status::invalid_argument(format!("Invalid resource name given ({field}={text}): {why}"))
    })?;
    Ok(project.to_owned())
}

/// Formats Ringpost's `name` as a resource in `project`.
pub fn format(project: &str, kind: Kind, name: &str) -> String {
    format!("projects/{project}/{}/{name}", kind.collection())
}

/// A project id, by the model's rules (`validate_project`).
fn validate_project(project: &str) -> Result<(), String> {
    ringpost_model::validate::validate_project(project).map_err(|invalid| invalid.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_into_project_and_ringpost_name_and_format_back() {
        let name = parse("topic", Kind::Topic, "projects/my-project/topics/orders").unwrap();
        assert_eq!(name, Name { project: "my-project".into(), name: "orders".into() });
        assert_eq!(format(&name.project, Kind::Topic, &name.name), "projects/my-project/topics/orders");
        let name = parse("subscription", Kind::Subscription, "projects/p/subscriptions/s-1.a~b+c%d").unwrap();
        assert_eq!(name.name, "s-1.a~b+c%d");
        assert_eq!(parse_project("project", "projects/example.com:p1").unwrap(), "example.com:p1");
    }

    #[test]
    fn bad_names_are_refused_naming_the_field() {
        for text in [
            "orders",
            "projects/p/topics",
            "projects/p/topics/orders/extra",
            "projects/p/subscriptions/orders",
            "projects//topics/orders",
            "projects/P/topics/orders",
            "projects/p/topics/1abc",
            "projects/p/topics/ab",
            "projects/p/topics/goog-topic",
        ] {
            let status = parse("topic", Kind::Topic, text).unwrap_err();
            assert_eq!(status.code, crate::api::Code::InvalidArgument, "{text}");
            assert!(status.message.contains(&format!("(topic={text})")), "{text}: {}", status.message);
        }
        assert!(parse_project("project", "projects/p/topics").is_err());
        assert!(parse_project("project", "p").is_err());
    }
}
