// Real-browser end-to-end tests: the built dist/ in headless Chromium.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { statSync, readFileSync } from "node:fs";
import path from "node:path";
import { serveDist, launchBrowser, fixture, recordRequests, screenshot } from "./harness.mjs";

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

test("a file set on the input goes through the worker and comes back estimated", async () => {
  const page = await browser.newPage();
  const errors = [];
  page.on("pageerror", (err) => errors.push(String(err)));
  const requests = recordRequests(page);

  await page.goto(site.url);
  // The worker posts "ready" once its wasm is loaded; the page says so.
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 30_000 });

  const trace = fixture("resnet18_sgd_bs16_pos1.json.gz");
  await page.setInputFiles("#file-input", trace);
  await page.locator("#results").waitFor({ timeout: 30_000 });

  // The worker read the file in slices and fingerprinted it: name and exact size.
  const size = statSync(trace).size.toLocaleString("en-US");
  assert.equal(await page.textContent("#trace-name"), `${path.basename(trace)} (${size} B)`);
  await screenshot(page, "file-estimated");

  assert.deepEqual(errors, [], "the page threw");
  const foreign = requests.filter((url) => !url.startsWith(site.origin));
  assert.deepEqual(foreign, [], "the page made requests outside its origin");
  await page.close();
});

test("a file dropped on the drop zone is read by the worker", async () => {
  const page = await browser.newPage();
  await page.goto(site.url);
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 30_000 });

  const trace = fixture("resnet18_sgd_bs32_pos1.json.gz");
  const base64 = readFileSync(trace).toString("base64");
  const name = path.basename(trace);
  const transfer = await page.evaluateHandle(
    ({ base64, name }) => {
      const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
      const dt = new DataTransfer();
      dt.items.add(new File([bytes], name, { type: "application/gzip" }));
      return dt;
    },
    { base64, name },
  );
  await page.dispatchEvent("#drop-zone", "dragover", { dataTransfer: transfer });
  await page.dispatchEvent("#drop-zone", "drop", { dataTransfer: transfer });
  await page.locator("#trace-name", { hasText: name }).waitFor({ timeout: 30_000 });
  const size = statSync(trace).size.toLocaleString("en-US");
  assert.equal(await page.textContent("#trace-name"), `${name} (${size} B)`);
  await screenshot(page, "file-dropped");
  await page.close();
});
