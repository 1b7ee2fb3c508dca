// LLM jobs on the page (issue 26): a generate() trace dropped shows its KV
// cache (calls, bytes at the end, bytes per token) and the report is the
// CLI's `memcast estimate --json` of the same file.

import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { serveDist, launchBrowser, fixture, openApp, cliRun, screenshot, dropFile } from "./harness.mjs";

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

test("a generate trace dropped: the KV cache and its bytes per token are shown, and the report is the CLI's", async () => {
  const file = fixture("llama_gen16_dynamic.json.gz", "traces-llm");
  const { page, problems } = await openApp(browser, site.url);
  await dropFile(page, file);
  await page.locator("#trace-name", { hasText: path.basename(file) }).waitFor({ timeout: 120_000 });
  await page.locator("#status", { hasText: "Ready." }).waitFor({ timeout: 60_000 });
  const facts = await page.textContent("#generation-facts");
  assert.match(facts, /16 calls of the model/, facts);
  assert.match(facts, /dynamic KV cache/, facts);
  assert.match(facts, /8,192 B per token|8192 B per token/, facts);
  if (!(await page.locator("#report-json-details").evaluate((d) => d.open))) {
    await page.click("#report-json-details summary");
  }
  const shown = JSON.parse(await page.inputValue("#report-json"));
  const gpus = shown.gpus.map((g) => g.preset).flatMap((g) => ["--gpu", g]);
  const expected = JSON.parse(cliRun(["estimate", "--json", file, ...gpus]));
  assert.deepEqual(shown, expected, "the page's report is the CLI's");
  assert.equal(shown.summary.generation.bytes_per_token, 8192);
  assert.equal(shown.summary.run_kind, "inference");
  await screenshot(page, "llm-generate");
  assert.deepEqual(problems, [], "the page threw");
  await page.close();
});
