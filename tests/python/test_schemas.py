"""Schemas through Google's SchemaServiceClient: an Avro and a Protocol Buffer schema created, a
revision committed and listed, a topic using one, its publishes checked (a message that does not
match refused, nothing of it delivered) and its messages carrying Pub/Sub's attributes."""

import json

import pytest
from google.api_core import exceptions
from google.cloud.pubsub import SchemaServiceClient
from google.pubsub_v1.types import Encoding, Schema

from helpers import create_subscription, create_topic, publish_all, pull_nothing, pull_until

AVRO = json.dumps(
    {
        "type": "record",
        "name": "State",
        "fields": [{"name": "name", "type": "string"}, {"name": "post_abbr", "type": "string"}],
    }
)
AVRO_WITH_POPULATION = json.dumps(
    {
        "type": "record",
        "name": "State",
        "fields": [
            {"name": "name", "type": "string"},
            {"name": "post_abbr", "type": "string"},
            {"name": "population", "type": ["null", "long"], "default": None},
        ],
    }
)
PROTOCOL_BUFFER = """syntax = "proto3";
message State {
  string name = 1;
  string post_abbr = 2;
}
"""


@pytest.fixture(scope="module")
def schemas(daemon):
    return SchemaServiceClient()


def schema_id(names, suffix):
    return f"{names.prefix}-{suffix}"


def test_avro_and_protocol_buffer_schemas_revisions_and_a_topic_that_uses_one(schemas, publisher, subscriber, names):
    avro = schemas.create_schema(
        request={
            "parent": names.project,
            "schema": Schema(type_=Schema.Type.AVRO, definition=AVRO),
            "schema_id": schema_id(names, "avro"),
        }
    )
    assert avro.name == f"{names.project}/schemas/{schema_id(names, 'avro')}"
    assert len(avro.revision_id) == 8
    proto = schemas.create_schema(
        request={
            "parent": names.project,
            "schema": Schema(type_=Schema.Type.PROTOCOL_BUFFER, definition=PROTOCOL_BUFFER),
            "schema_id": schema_id(names, "proto"),
        }
    )
    assert proto.type_ == Schema.Type.PROTOCOL_BUFFER
    with pytest.raises(exceptions.AlreadyExists):
        schemas.create_schema(
            request={
                "parent": names.project,
                "schema": Schema(type_=Schema.Type.AVRO, definition=AVRO),
                "schema_id": schema_id(names, "avro"),
            }
        )

    committed = schemas.commit_schema(
        request={"name": avro.name, "schema": Schema(type_=Schema.Type.AVRO, definition=AVRO_WITH_POPULATION)}
    )
    assert committed.revision_id != avro.revision_id
    revisions = [schema.revision_id for schema in schemas.list_schema_revisions(request={"name": avro.name})]
    assert revisions == [committed.revision_id, avro.revision_id]
    assert schemas.get_schema(request={"name": avro.name}).definition == AVRO_WITH_POPULATION

    topic = names.topic()
    created = create_topic(
        publisher, topic, schema_settings={"schema": avro.name, "encoding": Encoding.JSON}
    )
    assert created.schema_settings.schema == avro.name
    subscription = names.subscription()
    create_subscription(subscriber, subscription, topic)

    publish_all(publisher, topic, [json.dumps({"name": "Alaska", "post_abbr": "AK"}).encode()])
    with pytest.raises(exceptions.InvalidArgument):
        publish_all(publisher, topic, [json.dumps({"name": "Alaska"}).encode()])
    [received] = pull_until(subscriber, subscription, 1)
    assert received.message.attributes["googclient_schemaname"] == avro.name
    assert received.message.attributes["googclient_schemaencoding"] == "JSON"
    assert received.message.attributes["googclient_schemarevisionid"] in revisions
    pull_nothing(subscriber, subscription)
