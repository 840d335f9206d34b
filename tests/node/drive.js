// Drives the official Node.js SDK (@alicloud/log), unmodified, through one scenario against
// a LogHub server, and prints one JSON line per step: {"step", "ok", "result" | "error"}.
// tests/integration/test_node_sdk.py runs it and judges the results.
//
//   node tests/node/drive.js '{"endpoint": "127.0.0.1:PORT", "accessKeyId": "ak",
//                              "accessKeySecret": "sk", "project": "p", "logstore": "s"}'
//
// Addressing: the SDK sends every call with a project to http://<project>.<endpoint>, a name
// that does not resolve on a machine without wildcard DNS, and Node has no HTTP_PROXY
// support to route it as the Python SDKs do. So this harness (not the SDK) answers name
// look-ups of "<anything>.127.0.0.1" with 127.0.0.1 before the SDK is loaded; the request
// still carries Host: <project>.127.0.0.1:PORT, which is what the server routes by, exactly
// as against the hosted service.
'use strict';

const dns = require('dns');
const path = require('path');

const LOOPBACK_SUFFIX = '.127.0.0.1';
const systemLookup = dns.lookup;
dns.lookup = function lookup(hostname, options, callback) {
  if (typeof options === 'function') {
    callback = options;
    options = {};
  }
  if (typeof hostname === 'string' && hostname.endsWith(LOOPBACK_SUFFIX)) {
    if (options && options.all) {
      return process.nextTick(callback, null, [{ address: '127.0.0.1', family: 4 }]);
    }
    return process.nextTick(callback, null, '127.0.0.1', 4);
  }
  return systemLookup.call(dns, hostname, options, callback);
};

const Client = require(path.join(__dirname, 'node_modules', '@alicloud', 'log'));

const plan = JSON.parse(process.argv[2]);
const { project, logstore } = plan;

function client(secret) {
  return new Client({
    accessKeyId: plan.accessKeyId,
    accessKeySecret: secret,
    endpoint: `http://${plan.endpoint}`,
  });
}

async function step(name, call) {
  let line;
  try {
    const result = await call();
    line = { step: name, ok: true, result: result === undefined ? null : result };
  } catch (err) {
    line = { step: name, ok: false, error: { code: err.code || null, message: String(err.message) } };
  }
  process.stdout.write(JSON.stringify(line) + '\n');
}

async function main() {
  const sdk = client(plan.accessKeySecret);
  const scratchProject = `${project}-scratch`;
  const scratchStore = `${logstore}-scratch`;
  const now = new Date();
  const hourAgo = new Date(now.getTime() - 3600 * 1000);

  await step('createProject', () => sdk.createProject(project, { description: 'from node' }));
  await step('createProjectAgain', () => sdk.createProject(project, { description: 'again' }));
  await step('getProject', () => sdk.getProject(project));
  await step('createLogStore', () => sdk.createLogStore(project, logstore, { ttl: 7, shardCount: 2 }));
  await step('getLogStore', () => sdk.getLogStore(project, logstore));
  // sends offset=&size=&logstoreName=: empty must mean "the default"
  await step('listLogStore', () => sdk.listLogStore(project, {}));
  await step('listLogStoreByName', () => sdk.listLogStore(project, { logstoreName: logstore, offset: 0, size: 10 }));
  await step('updateLogStore', () => sdk.updateLogStore(project, logstore, { ttl: 30, shardCount: 2 }));
  await step('getLogStoreUpdated', () => sdk.getLogStore(project, logstore));
  await step('postLogStoreLogs', () => sdk.postLogStoreLogs(project, logstore, {
    logs: [0, 1, 2].map((i) => ({
      timestamp: 1700000000 + i,
      timestampNsPart: 123456789 + i,
      content: { msg: `node ${i}`, unicode: '日志 ✓' },
    })),
    tags: [{ env: 'node' }, { zone: 'z1' }],
    topic: 'node-topic',
    source: '10.9.8.7',
  }));
  await step('getLogs', () => sdk.getLogs(project, logstore, hourAgo, now, { query: '*' }));
  await step('getHistograms', () => sdk.getHistograms(project, logstore, hourAgo, now));
  await step('getIndexConfig', () => sdk.getIndexConfig(project, logstore));
  await step('wrongSecret', () => client('not-the-secret').getProject(project));
  await step('createScratchLogStore', () => sdk.createLogStore(project, scratchStore, { ttl: 1, shardCount: 1 }));
  await step('deleteScratchLogStore', () => sdk.deleteLogStore(project, scratchStore));
  await step('getDeletedLogStore', () => sdk.getLogStore(project, scratchStore));
  await step('createScratchProject', () => sdk.createProject(scratchProject, { description: 'x' }));
  await step('deleteScratchProject', () => sdk.deleteProject(scratchProject));
  // v1 does not sign Host: GetProject of another project in the same second would carry
  // the same signature as the first one, which the server binds to that project (a 503 the
  // Python SDK retries and this SDK does not); the next second signs anew
  await new Promise((resolve) => setTimeout(resolve, 1050 - (Date.now() % 1000)));
  await step('getDeletedProject', () => sdk.getProject(scratchProject));
}

main().catch((err) => {
  process.stderr.write(`${err.stack}\n`);
  process.exit(2);
});
