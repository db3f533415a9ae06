// Google's Node.js Pub/Sub client (@google-cloud/pubsub, pinned in package.json) against
// ringpostd's REST API, with `fallback: 'rest'` and the emulator's settings: the endpoint from
// PUBSUB_EMULATOR_HOST (set by the Rust test `node_client` to `--rest-listen`'s address), plain
// HTTP, no Google credentials. It creates a topic and a subscription, publishes with an
// attribute and an ordering key, pulls, acknowledges, seeks back and pulls again, then deletes
// both; any failure ends the process non-zero with the error.
'use strict';

const assert = require('node:assert/strict');
const { PubSub, v1 } = require('@google-cloud/pubsub');

const project = 'node-project';
const endpoint = process.env.PUBSUB_EMULATOR_HOST;
if (!endpoint) {
    throw new Error('PUBSUB_EMULATOR_HOST must name the REST API, HOST:PORT');
}

// The emulator needs no credentials: REST calls go out through this in place of Google's
// auth client, which would look for them. It sends what the client built, unchanged.
const noCredentials = {
    universeDomain: 'googleapis.com',
    getRequestHeaders: async () => new Headers(),
    fetch: (url, request) =>
        fetch(url, { method: request.method, headers: request.headers, body: request.body, signal: request.signal }),
};
const options = { projectId: project, fallback: 'rest', protocol: 'http', authClient: noCredentials };

async function main() {
    const pubsub = new PubSub({ ...options, apiEndpoint: endpoint, emulatorMode: true });
    const [host, port] = endpoint.split(':');
    const subscriber = new v1.SubscriberClient({ ...options, servicePath: host, port: Number(port) });

    const [topic] = await pubsub.createTopic('node-orders');
    assert.equal(topic.name, `projects/${project}/topics/node-orders`);
    const [subscription] = await topic.createSubscription('node-orders-reader', {
        ackDeadlineSeconds: 10,
        retainAckedMessages: true,
    });
    const [topics] = await pubsub.getTopics();
    assert.ok(topics.some((listed) => listed.name === topic.name), 'the topic is listed');

    const publisher = pubsub.topic('node-orders', { messageOrdering: true });
    const id = await publisher.publishMessage({
        data: Buffer.from('order 1'),
        attributes: { region: 'eu' },
        orderingKey: 'customer-7',
    });
    assert.match(id, /^\d+$/);

    const pull = async () => {
        const [response] = await subscriber.pull({ subscription: subscription.name, maxMessages: 10 });
        return response.receivedMessages || [];
    };
    const received = await pull();
    assert.equal(received.length, 1);
    const message = received[0].message;
    assert.equal(Buffer.from(message.data).toString(), 'order 1');
    assert.deepEqual({ ...message.attributes }, { region: 'eu' });
    assert.equal(message.orderingKey, 'customer-7');
    assert.equal(message.messageId, id);
    await subscriber.acknowledge({ subscription: subscription.name, ackIds: [received[0].ackId] });
    assert.equal((await pull()).length, 0, 'nothing is left once acknowledged');

    // Back to before the publish: the acknowledged message (retained) is delivered again.
    await subscription.seek(new Date(0));
    const again = await pull();
    assert.equal(again.length, 1);
    assert.equal(Buffer.from(again[0].message.data).toString(), 'order 1');

    await subscription.delete();
    await topic.delete();
    const [exists] = await pubsub.topic('node-orders').exists();
    assert.equal(exists, false, 'the topic is gone');
    await pubsub.close();
    await subscriber.close();
    console.log('the Node.js client over REST: ok');
}

main().catch((error) => {
    console.error(error);
    process.exit(1);
});
