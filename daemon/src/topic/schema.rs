//! A topic's schema on the forwarder that appends its publishes: the router pushes it
//! (`ControlRequest::SetTopicSchema`) at each attach and each change, and every publish that
//! was not checked before it reached the forwarder (a native one, or one carried from another
//! node) is checked here, before any of its messages is appended, with the gRPC API's rules
//! and wording (`crate::schema::TopicValidator`). A topic without a schema holds `None` and
//! costs its publishes that one check.

use crate::api::data::{Attributes, DataError, MessageView, PublishBatch};
use crate::router::schemas::TopicSchema;
use crate::schema::TopicValidator;

/// The attribute naming a message's schema.
const SCHEMA_NAME_ATTRIBUTE: &str = "googclient_schemaname";

/// A topic's schema, compiled, with what it was compiled from (so that the same schema pushed
/// again is not compiled again).
#[derive(Debug)]
pub struct TopicSchemaCheck {
    pub source: TopicSchema,
    validator: TopicValidator,
    /// What the `googclient_schemaname` attribute says: the schema's name in the default
    /// project (a native publish names no project), or `DELETED_SCHEMA`.
    schema_name: String,
}

impl TopicSchemaCheck {
    /// Compiles `schema`'s revisions: a Protocol Buffer definition takes milliseconds, which
    /// the shard spends once per change of a schema, never per publish.
    pub fn new(schema: TopicSchema) -> TopicSchemaCheck {
        let validator = TopicValidator::new(schema.settings.clone(), &schema.revisions);
        let schema_name = match schema.settings.schema.as_str() {
            crate::catalog::schemas::DELETED_SCHEMA => crate::catalog::schemas::DELETED_SCHEMA.to_owned(),
            name => format!("projects/{}/schemas/{name}", ringpost_model::limits::PUSH_PROJECT_DEFAULT),
        };
        TopicSchemaCheck { source: schema, validator, schema_name }
    }

    /// The schema's name as `message`'s attribute says it: the name a gRPC gateway gave it in
    /// the project its publish named, kept when the publish was carried here from another node
    /// (every project sees the same schemas), else the default project's.
    fn schema_name_for<'a>(&'a self, message: &MessageView<'a>) -> &'a str {
        let (default, suffix) = (&self.schema_name, self.schema_name.rsplit_once("/schemas/"));
        let Some((_, name)) = suffix else { return default };
        let names_ours = |value: &str| {
            let project = value.strip_prefix("projects/").and_then(|rest| rest.strip_suffix(name));
            project
                .and_then(|project| project.strip_suffix("/schemas/"))
                .is_some_and(|project| !project.is_empty() && !project.contains('/'))
        };
        let given =
            message.attributes().find(|(key, value)| *key == SCHEMA_NAME_ATTRIBUTE && names_ours(value));
        given.map_or(default, |(_, value)| value)
    }

    /// Checks every message of `batch`: the batch with Pub/Sub's three attributes added to each,
    /// or `InvalidArgument` in Pub/Sub's words at the first message that matches no revision.
    pub fn check(&self, batch: impl PublishBatch) -> Result<SchemaChecked, DataError> {
        let mut added = Vec::new();
        let mut refused = None;
        batch.visit(&mut |_, messages| {
            added.reserve(messages.len());
            for message in messages {
                match self.validator.check(message.data) {
                    Ok(revision_id) => {
                        let schema_name = self.schema_name_for(&message);
                        added.push(self.validator.attributes(schema_name, revision_id))
                    }
                    Err(why) => {
                        refused = Some(why);
                        return;
                    }
                }
            }
        })?;
        match refused {
            Some(why) => Err(DataError::InvalidArgument(why)),
            // Boxed: one type whatever the batch's, which the shard's publish takes again.
            None => Ok(SchemaChecked { batch: Box::new(batch), added }),
        }
    }
}

/// A publish checked against its topic's schema: each message with the attributes Pub/Sub adds
/// to one that matched (replacing any of the same keys it carried).
pub struct SchemaChecked {
    batch: Box<dyn PublishBatch>,
    added: Vec<[(String, String); 3]>,
}

/// A message's attributes with the schema's three, in key order.
struct Merged<'a>(Vec<(&'a str, &'a str)>);

impl Attributes for Merged<'_> {
    fn count(&self) -> usize {
        self.0.len()
    }
    fn get(&self, index: usize) -> (&str, &str) {
        self.0[index]
    }
}

impl PublishBatch for SchemaChecked {
    fn visit(
        &self,
        visit: &mut dyn FnMut(&str, &mut dyn ExactSizeIterator<Item = MessageView<'_>>),
    ) -> Result<(), DataError> {
        self.batch.visit(&mut |topic, messages| {
            let merged: Vec<(MessageView<'_>, Merged<'_>)> = messages
                .zip(&self.added)
                .map(|(message, added)| {
                    let ours = |key: &str| added.iter().any(|(added_key, _)| added_key == key);
                    let mut attributes: Vec<(&str, &str)> =
                        message.attributes().filter(|(key, _)| !ours(key)).collect();
                    attributes.extend(added.iter().map(|(key, value)| (key.as_str(), value.as_str())));
                    attributes.sort_unstable();
                    (message, Merged(attributes))
                })
                .collect();
            let mut views = merged.iter().map(|(message, attributes)| MessageView {
                data: message.data,
                attributes,
                ordering_key: message.ordering_key,
            });
            visit(topic, &mut views);
        })
    }

    fn checked_against_schema(&self) -> bool {
        true
    }
}

/// For tests: schema "counts", JSON, of one Avro revision ("0000000a", a record of one int,
/// `n`), every revision allowed.
#[cfg(test)]
pub fn counts_schema() -> TopicSchema {
    use crate::catalog::schemas::{SchemaEncoding, SchemaRevision, SchemaSettings, SchemaType};
    TopicSchema {
        settings: SchemaSettings {
            schema: "counts".to_owned(),
            encoding: SchemaEncoding::Json,
            first_revision_id: String::new(),
            last_revision_id: String::new(),
        },
        revisions: vec![SchemaRevision {
            revision_id: "0000000a".to_owned(),
            schema_type: SchemaType::Avro,
            definition: r#"{"type": "record", "name": "Count", "fields": [{"name": "n", "type": "int"}]}"#
                .to_owned(),
            created_ms: 1,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A message's data and attributes.
    type Owned = (Vec<u8>, Vec<(String, String)>);

    struct Batch(Vec<Owned>);

    struct Pairs<'a>(&'a [(String, String)]);

    impl Attributes for Pairs<'_> {
        fn count(&self) -> usize {
            self.0.len()
        }
        fn get(&self, index: usize) -> (&str, &str) {
            (&self.0[index].0, &self.0[index].1)
        }
    }

    impl PublishBatch for Batch {
        fn visit(
            &self,
            visit: &mut dyn FnMut(&str, &mut dyn ExactSizeIterator<Item = MessageView<'_>>),
        ) -> Result<(), DataError> {
            let pairs: Vec<Pairs<'_>> = self.0.iter().map(|(_, attributes)| Pairs(attributes)).collect();
            let mut views = self.0.iter().zip(&pairs).map(|((data, _), attributes)| MessageView {
                data,
                attributes,
                ordering_key: "",
            });
            visit("states", &mut views);
            Ok(())
        }
    }

    fn check() -> TopicSchemaCheck {
        TopicSchemaCheck::new(counts_schema())
    }

    fn attributes_of(batch: &impl PublishBatch) -> Vec<Vec<(String, String)>> {
        let mut seen = Vec::new();
        batch
            .visit(&mut |_, messages| {
                for message in messages {
                    seen.push(message.attributes().map(|(k, v)| (k.to_owned(), v.to_owned())).collect());
                }
            })
            .unwrap();
        seen
    }

    /// Matching messages get Pub/Sub's three attributes (a client's own of those keys replaced,
    /// its others kept); one that matches nothing refuses the batch in Pub/Sub's words.
    #[test]
    fn a_checked_batch_carries_the_schemas_attributes_and_a_mismatch_refuses_it_whole() {
        let own =
            vec![("a".to_owned(), "1".to_owned()), ("googclient_schemaname".to_owned(), "forged".to_owned())];
        let batch = Batch(vec![(br#"{"n": 1}"#.to_vec(), own), (br#"{"n": 2}"#.to_vec(), Vec::new())]);
        let checked = check().check(batch).unwrap();
        assert!(checked.checked_against_schema());
        let seen = attributes_of(&checked);
        assert_eq!(
            seen[0],
            [
                ("a", "1"),
                ("googclient_schemaencoding", "JSON"),
                ("googclient_schemaname", "projects/ringpost/schemas/counts"),
                ("googclient_schemarevisionid", "0000000a"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert_eq!(seen[1].len(), 3);
        // A gateway's name of the schema in the project its publish named is kept.
        let named = vec![("googclient_schemaname".to_owned(), "projects/p/schemas/counts".to_owned())];
        let carried = check().check(Batch(vec![(br#"{"n": 1}"#.to_vec(), named)])).unwrap();
        assert_eq!(attributes_of(&carried)[0][1].1, "projects/p/schemas/counts");
        let other = vec![("googclient_schemaname".to_owned(), "projects/p/schemas/other".to_owned())];
        let forged = check().check(Batch(vec![(br#"{"n": 1}"#.to_vec(), other)])).unwrap();
        assert_eq!(attributes_of(&forged)[0][1].1, "projects/ringpost/schemas/counts");
        let bad = Batch(vec![(br#"{"n": 1}"#.to_vec(), Vec::new()), (b"not json".to_vec(), Vec::new())]);
        match check().check(bad) {
            Err(DataError::InvalidArgument(why)) => {
                assert!(why.starts_with(crate::schema::SCHEMA_MISMATCH), "{why}")
            }
            Err(other) => panic!("refused otherwise: {other:?}"),
            Ok(_) => panic!("a message of no revision was accepted"),
        }
    }
}
