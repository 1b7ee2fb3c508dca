// Nothing the user gives is lost while the worker starts: a file dropped or
// picked, the demo, or a permalink's trace given before the worker has said
// "ready" is queued and runs as soon as it is, and the status line says what
// is happening meanwhile (never "Ready." while the worker is not). The
// worker's start is slowed on purpose (the test server holds the worker's
// request for its WebAssembly), as on a slow network or a busy laptop.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import {
  serveDist, launchBrowser, fixture, longTrace, cliEstimate, cliRun, bytesOf, dropFile, recordStartup, startupLog,
  screenshot,
} from "./harness.mjs";

/** How long the test server holds the worker's WebAssembly. */
const SLOW_MS = 4000;

let site;
let browser;

before(async () => {
  site = await serveDist({ slowWorkerMs: SLOW_MS });
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await site?.close();
});

/** A fresh page on the slow site that records its status line and workers. */
async function slowPage(url = site.url) {
  const page = await browser.newPage();
  const problems = [];
  page.on("pageerror", (err) => problems.push(String(err)));
  const requests = [];
  page.on("request", (r) => requests.push(r.url()));
  await recordStartup(page);
  await page.goto(url);
  await page.locator("#drop-zone").waitFor({ timeout: 30_000 });
  return { page, problems, requests };
}

/**
 * Checks the log of a page given `name` from `givenAt` on, before the worker
 * `worker` (0: the first, 1: the one a Cancel started) was ready: the input
 * came first, the status line named it while the worker started, and it
 * never said "Ready." from `since` until that worker was.
 */
function assertQueued(log, { name, givenAt, worker = 0, since = 0 }) {
  const ready = log.ready[worker];
  assert.ok(ready !== undefined, `worker ${worker} never said ready: ${JSON.stringify(log)}`);
  assert.ok(givenAt < ready, `the input came ${givenAt - ready} ms after the worker was ready: the test proves nothing`);
  const early = log.status.filter(([t, text]) => t >= since && t < ready);
  assert.deepEqual(early.filter(([, text]) => /Ready/.test(text ?? "")), [], "the status said Ready before the worker was");
  assert.ok(
    early.some(([t, text]) => t >= givenAt && /Starting/.test(text ?? "") && text.includes(name)),
    `the status never said that ${name} waits for the worker: ${JSON.stringify(early)}`,
  );
}

test("a file dropped the moment the page appears is queued while the worker starts, then estimated", async () => {
  const { page, problems, requests } = await slowPage();
  const file = fixture("resnet18_sgd_bs32_pos1.json.gz");
  const name = path.basename(file);
  const givenAt = (await startupLog(page)).now;
  await dropFile(page, file);
  await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 60_000 });
  assertQueued(await startupLog(page), { name, givenAt });
  assert.equal(bytesOf(await page.textContent("#peak-total-bytes")), cliEstimate(file).peak.total_bytes);
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 10_000 });
  assert.deepEqual(problems, [], "the page threw");
  assert.deepEqual(requests.filter((u) => !u.startsWith(site.origin)), [], "requests left the origin");
  await page.close();
});

test("a file picked and the demo asked for while the worker starts are estimated too", async () => {
  {
    const { page, problems } = await slowPage();
    const file = fixture("mobilenet_v2_sgd_bs16_pos0.json.gz");
    const name = path.basename(file);
    const givenAt = (await startupLog(page)).now;
    await page.setInputFiles("#file-input", file);
    await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 60_000 });
    assertQueued(await startupLog(page), { name, givenAt });
    assert.deepEqual(problems, [], "the page threw");
    await page.close();
  }
  {
    const { page, problems } = await slowPage();
    const givenAt = (await startupLog(page)).now;
    await page.click("#demo");
    const name = "resnet18_sgd_bs16_pos1.json.gz";
    await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 60_000 });
    assertQueued(await startupLog(page), { name, givenAt });
    assert.equal(
      bytesOf(await page.textContent("#peak-total-bytes")),
      cliEstimate(fixture(name)).peak.total_bytes,
    );
    assert.deepEqual(problems, [], "the page threw");
    await page.close();
  }
});

test("a permalink opened while the worker starts shows at once, and its trace dropped then is computed", async () => {
  const file = fixture("resnet18_sgd_bs16_pos1.json.gz");
  const name = path.basename(file);
  const link = cliRun(["estimate", file, "--link", site.url]).trim();
  const { page, problems } = await slowPage(link);
  // The shared estimate needs no worker: it is on screen before the worker is ready.
  await page.locator("#shared-banner").waitFor({ timeout: 10_000 });
  const early = await startupLog(page);
  assert.equal(early.ready.length, 0, "the worker was ready before the shared estimate showed: the test proves nothing");
  await screenshot(page, "permalink-while-starting");
  const givenAt = (await startupLog(page)).now;
  await dropFile(page, file);
  await page.locator("#shared-banner").waitFor({ state: "detached", timeout: 60_000 });
  await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 60_000 });
  assertQueued(await startupLog(page), { name, givenAt });
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});

test("a file dropped while a cancelled worker restarts is queued, and the previous estimate stays meanwhile", async () => {
  const { page, problems } = await slowPage();
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  await page.setInputFiles("#file-input", fixture("resnet18_sgd_bs16_pos1.json.gz"));
  await page.locator("#peak-total-bytes").waitFor({ timeout: 60_000 });
  const before = await page.textContent("#peak-total-bytes");

  // A job long enough to cancel in the middle: t5-small's events three times over.
  const long = longTrace(3);
  await page.setInputFiles("#file-input", long);
  await page.locator("#cancel").waitFor({ timeout: 30_000 });
  await page.click("#cancel");
  const cancelledAt = (await startupLog(page)).now;
  const file = fixture("resnet18_sgd_bs32_pos1.json.gz");
  const name = path.basename(file);
  const givenAt = (await startupLog(page)).now;
  await dropFile(page, file);
  // While the new worker starts, the cancelled job's predecessor is on screen.
  assert.equal(await page.textContent("#peak-total-bytes"), before, "the previous estimate is kept");
  await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 60_000 });
  assertQueued(await startupLog(page), { name, givenAt, worker: 1, since: cancelledAt });
  assert.doesNotMatch(await page.textContent("#trace-name"), /long/);
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});
