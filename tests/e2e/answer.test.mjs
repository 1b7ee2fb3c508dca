// The answer always answers the fields, or says which settings it answers:
// after a Cancel, a refusal on a shared link and a worker that dies, the
// verdict is greyed with its settings beside the fields'. A trace made by the
// capture helper answers for the full job at once, its fields filled in. At
// 390 px wide the page has no horizontal scroll once a result is shown.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { readFile } from "node:fs/promises";
import {
  ROOT, serveDist, launchBrowser, openApp, cliRun, screenshot, dropFile, reportJson, gpuArgs,
} from "./harness.mjs";

const CAPTURED = path.join(ROOT, "tests", "data", "traces-capture", "tiny-llama_train_L2.json.gz");

let site;
let browser;

before(async () => {
  site = await serveDist();
  browser = await launchBrowser();
});

after(async () => {
  await browser?.close();
  await site?.close();
});

/** Drops the captured trace and waits for its estimate. */
async function dropCaptured(page) {
  await dropFile(page, CAPTURED);
  await page.locator("#trace-name", { hasText: path.basename(CAPTURED) }).waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
}

/** The page's main worker (the one that runs the pipeline). */
function pipelineWorker(page) {
  const worker = page.workers().find((w) => /worker_loader\.js/.test(w.url()));
  assert.ok(worker, `no pipeline worker among ${page.workers().map((w) => w.url())}`);
  return worker;
}

test("a captured trace answers for the full job at once: fields filled, rebuild shown, the CLI's report", async () => {
  const { page, problems } = await openApp(browser, site.url);
  await dropCaptured(page);
  assert.equal(await page.inputValue("#layers"), "6", "the full job's layers, from the trace");
  assert.equal(await page.inputValue("#seq-len"), "256", "the full job's length, from the trace");
  assert.match(await page.textContent("#scaled-note"), /6 blocks per stack at sequence length 256/);
  assert.match(await page.textContent("#capture-facts"), /train of tiny/);
  assert.equal(await page.locator("#stale-banner").count(), 0, "the verdict answers the fields");
  const shown = await reportJson(page);
  const expected = JSON.parse(cliRun(["estimate", "--json", CAPTURED, ...gpuArgs(shown)]));
  assert.deepEqual(shown, expected, "the CLI answers the same trace the same way, without flags");
  // The link carries the figures it answered: the CLI's --link with them.
  const link = await page.inputValue("#permalink");
  const cliLink = cliRun(["estimate", CAPTURED, "--link", site.url, ...gpuArgs(shown), "--layers", "6", "--seq-len", "256"]).trim();
  assert.equal(link, cliLink);
  assert.deepEqual(problems, []);
  await page.close();
});

test("after a Cancel the verdict says which settings it answers, and can put them back", async () => {
  const { page, problems } = await openApp(browser, site.url);
  await dropCaptured(page);
  await page.fill("#layers", "900");
  await page.click("#scale-apply");
  await page.locator("#cancel").waitFor({ timeout: 30_000 });
  await page.click("#cancel");
  await page.locator("#error", { hasText: "Cancelled" }).waitFor({ timeout: 30_000 });
  const banner = page.locator("#stale-banner");
  await banner.waitFor({ timeout: 10_000 });
  assert.match(await banner.textContent(), /answer is for layers 6.*fields ask for layers 900/s);
  assert.ok(await page.locator(".result.first.stale").count(), "the verdict is greyed");
  await screenshot(page, "answer-after-cancel");
  await page.click("#stale-restore");
  await banner.waitFor({ state: "detached", timeout: 10_000 });
  assert.equal(await page.inputValue("#layers"), "6");
  assert.deepEqual(problems, []);
  await page.close();
});

test("a refused edit on a shared link leaves the verdict marked with the link's settings", async () => {
  const link = cliRun(["estimate", CAPTURED, "--link", site.url, "--gpu", "a100-80gb"]).trim();
  const page = await browser.newPage();
  await page.goto(link);
  await page.locator("#shared-banner").waitFor({ timeout: 30_000 });
  assert.equal(await page.inputValue("#layers"), "6", "the link restores the figures it answered");
  assert.equal(await page.locator("#stale-banner").count(), 0);
  await page.fill("#layers", "48");
  await page.click("#scale-apply");
  await page.locator("#error", { hasText: "need the trace" }).waitFor({ timeout: 30_000 });
  assert.match(await page.textContent("#stale-banner"), /layers 6.*layers 48/s);
  await page.close();
});

test("a worker that dies gives a clear error and a fresh worker; the previous estimate is kept and labelled", async () => {
  const { page } = await openApp(browser, site.url);
  await dropCaptured(page);
  const before = await reportJson(page);
  // The next request makes the worker throw what a WebAssembly worker out of
  // memory throws (a running job blocks the worker's thread, so the error is
  // planted before the request).
  await pipelineWorker(page).evaluate(() => {
    const original = self.onmessage;
    self.onmessage = () => {
      self.onmessage = original;
      throw new WebAssembly.RuntimeError("unreachable");
    };
  });
  await page.fill("#layers", "900");
  await page.click("#scale-apply");
  await page.locator("#error", { hasText: "The worker stopped" }).waitFor({ timeout: 30_000 });
  assert.match(await page.textContent("#error"), /unreachable.*fresh worker.*previous one/s);
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  assert.match(await page.textContent("#stale-banner"), /layers 6.*layers 900/s);
  assert.deepEqual(await reportJson(page), before, "the estimate shown is the previous one");
  await screenshot(page, "answer-after-crash");
  // The fresh worker works.
  await page.click("#stale-restore");
  await page.fill("#layers", "8");
  await page.click("#scale-apply");
  await page.locator("#scaled-table #scaled-depth", { hasText: "8" }).waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  assert.equal(await page.locator("#stale-banner").count(), 0);
  await page.close();
});

/** What sticks out of the viewport: the page's width and every element wider than the screen. */
async function overflow(page) {
  return page.evaluate(() => {
    const width = document.documentElement.clientWidth;
    // Boxes past the edge, and text that runs out of its box (a long word).
    const wide = [...document.querySelectorAll("main *")]
      .filter((el) => !el.closest("table, pre, textarea"))
      .filter((el) => el.getBoundingClientRect().right > width + 1
        || (el.scrollWidth > el.clientWidth + 1 && getComputedStyle(el).overflowX === "visible" && el.clientWidth > 0))
      .slice(0, 8)
      .map((el) => `${el.tagName.toLowerCase()}#${el.id}.${el.className} right=${Math.round(el.getBoundingClientRect().right)}`);
    return { scroll: document.documentElement.scrollWidth, width, wide };
  });
}

for (const [width, height] of [[390, 844], [1920, 1080]]) {
  test(`${width} px wide with a result shown: no horizontal scroll, charts drawn at the screen's width`, async () => {
    const { page, problems } = await openApp(browser, site.url);
    await page.setViewportSize({ width, height });
    await dropCaptured(page);
    await page.click("#whatif-alloc");
    await page.locator("#whatif-result").waitFor({ timeout: 120_000 });
    await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
    const seen = await overflow(page);
    await screenshot(page, `answer-${width}px`);
    assert.ok(seen.scroll <= seen.width, `the page scrolls sideways: ${JSON.stringify(seen)}`);
    assert.deepEqual(seen.wide, [], "nothing sticks out of the screen");
    for (const id of ["timeline-chart", "gpu-chart", "breakdown-chart", "whatif-chart"]) {
      const box = await page.locator(`#${id}`).boundingBox();
      const drawn = await page.locator(`#${id}`).evaluate((c) => c.width);
      assert.ok(box.width <= width, `${id} fits the screen`);
      assert.ok(Math.abs(drawn - box.width) <= 2, `${id} is drawn at the size it is shown (${drawn} vs ${box.width})`);
    }
    assert.deepEqual(problems, []);
    await page.close();
  });
}

test("the capture guide writes the helper's command for the job described, and the site ships the helper", async () => {
  const { page } = await openApp(browser, site.url);
  await page.click("#capture summary");
  await page.fill("#capture-model", "gpt2");
  await page.selectOption("#capture-job", "generate");
  await page.fill("#capture-seq-len", "512");
  await page.fill("#capture-new-tokens", "1024");
  const command = await page.textContent("#capture-command");
  assert.match(command, /pip install torch transformers\n/);
  assert.match(command, /python memcast_capture\.py gpt2 --job generate --precision bf16-mixed --seq-len 512 --new-tokens 1024/);
  const href = await page.getAttribute("#capture-helper", "href");
  const response = await page.request.get(new URL(href, site.url).toString());
  assert.equal(response.status(), 200);
  assert.equal(await response.text(), await readFile(path.join(ROOT, "www", "memcast_capture.py"), "utf8"));
  await page.close();
});
