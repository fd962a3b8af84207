//! Files proved to open in the viewers people use, offline: Debian's
//! headless `chromium` driven by npm's `playwright-core`, and npm's
//! `speedscope` served on 127.0.0.1 (no browser download, nothing fetched
//! by the page).
//!
//! [`Viewers::install`] installs what is missing (Debian's chromium,
//! nodejs and npm; the npm packages into a directory the caller owns, kept
//! there for the next run). [`Viewers::check`] launches the browser once for
//! a whole list of [`Page`]s and reports, for each, what a user would see
//! and what the page said: its title, dialogs (speedscope's "Unrecognized
//! format" is an `alert`), page errors and console warnings, and for
//! speedscope every profile with the symbols of its sandwich view.

use std::path::{Path, PathBuf};
use std::process::Command;

/// speedscope's version: the one papirus' research checked.
pub const SPEEDSCOPE: &str = "speedscope@1.25.0";
/// playwright-core's version: the newest that runs on Debian 12's node 18.
pub const PLAYWRIGHT: &str = "playwright-core@1.60.0";

/// What to open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    /// A profile loaded into speedscope (by URL, as `#profileURL=` does).
    Speedscope(PathBuf),
    /// A file opened as it is (an SVG), its screenshot written to the `PathBuf`, if any.
    Plain(PathBuf, Option<PathBuf>),
}

/// One speedscope profile (a thread of a Chrome trace).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Profile {
    /// Its name in speedscope's profile selector.
    pub name: String,
    /// The symbols of its sandwich view, as drawn.
    pub symbols: Vec<String>,
}

/// What a page showed and said.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
pub struct Seen {
    /// The document's title once loaded.
    pub title: String,
    /// Messages of `alert`/`confirm` dialogs.
    pub dialogs: Vec<String>,
    /// Uncaught page errors.
    pub errors: Vec<String>,
    /// Console warnings and errors, but for the GPU driver's own (SwiftShader
    /// notes on `ReadPixels`, which say nothing of the page).
    pub warnings: Vec<String>,
    /// speedscope's profiles.
    pub profiles: Vec<Profile>,
    /// Elements in the document (an SVG's frames are `g` elements).
    pub elements: usize,
}

/// The installed viewers.
#[derive(Debug, Clone)]
pub struct Viewers {
    modules: PathBuf,
    chromium: PathBuf,
}

fn run(cmd: &mut Command, what: &str) -> Result<String, String> {
    let o = cmd.output().map_err(|e| format!("cannot run {what}: {e}"))?;
    if !o.status.success() {
        return Err(format!("{what} failed ({}): {}", o.status, String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

impl Viewers {
    /// Installs what is missing: Debian's `chromium`, `nodejs` and `npm`,
    /// then [`SPEEDSCOPE`] and [`PLAYWRIGHT`] into `dir/node_modules`
    /// (kept for later runs). `Err` says what could not be had.
    pub fn install(dir: &Path) -> Result<Viewers, String> {
        crate::debian_package("chromium", || Path::new("/usr/bin/chromium").is_file())?;
        crate::debian_package("nodejs", || crate::runs("node", &["--version"]))?;
        crate::debian_package("npm", || crate::runs("npm", &["--version"]))?;
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let modules = dir.join("node_modules");
        let have = |spec: &str| {
            let (name, version) = spec.rsplit_once('@').unwrap_or((spec, ""));
            std::fs::read_to_string(modules.join(name).join("package.json"))
                .is_ok_and(|p| p.contains(&format!("\"version\": \"{version}\"")))
        };
        if !have(SPEEDSCOPE) || !have(PLAYWRIGHT) {
            run(
                Command::new("npm")
                    .args(["install", "--no-audit", "--no-fund", "--no-save", "--prefix"])
                    .arg(dir)
                    .args([SPEEDSCOPE, PLAYWRIGHT]),
                "npm install",
            )?;
        }
        Ok(Viewers { modules, chromium: PathBuf::from("/usr/bin/chromium") })
    }

    /// Opens every page in one headless browser; what each showed, in order.
    pub fn check(&self, pages: &[Page]) -> Result<Vec<Seen>, String> {
        // A fresh private directory (mkdtemp, 0700), removed on return.
        let dir = tempfile::Builder::new().prefix("papirus-browser-").tempdir().map_err(|e| e.to_string())?;
        let scratch = dir.path();
        let script = scratch.join("check.js");
        std::fs::write(&script, SCRIPT).map_err(|e| e.to_string())?;
        let list: Vec<serde_json::Value> = pages
            .iter()
            .map(|p| match p {
                Page::Speedscope(f) => serde_json::json!({ "kind": "speedscope", "file": f }),
                Page::Plain(f, shot) => serde_json::json!({ "kind": "plain", "file": f, "screenshot": shot }),
            })
            .collect();
        let input = scratch.join("pages.json");
        std::fs::write(&input, serde_json::to_vec(&list).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
        let out = run(
            Command::new("node")
                .arg(&script)
                .arg(&input)
                .arg(self.modules.join("speedscope/dist/release"))
                .arg(&self.chromium)
                .env("NODE_PATH", &self.modules),
            "headless chromium (node check.js)",
        );
        serde_json::from_str(&out?).map_err(|e| format!("the browser's report does not parse: {e}"))
    }
}

/// The browser side: serves speedscope and the files on 127.0.0.1, opens
/// each page, reports what it saw as JSON on stdout.
const SCRIPT: &str = r#"
const { chromium } = require('playwright-core');
const http = require('http'), fs = require('fs'), path = require('path');
const [pagesFile, speedscope, executable] = process.argv.slice(2);
const pages = JSON.parse(fs.readFileSync(pagesFile, 'utf8'));
const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.json': 'application/json',
  '.wasm': 'application/wasm', '.png': 'image/png', '.svg': 'image/svg+xml', '.woff2': 'font/woff2' };
const server = http.createServer((req, res) => {
  const url = decodeURIComponent(req.url.split('?')[0]);
  // The browser asks every origin for one; none is part of what is checked.
  if (url === '/favicon.ico') { res.writeHead(204); res.end(); return; }
  let file;
  const m = url.match(/^\/page\/(\d+)\//);
  if (m) file = pages[Number(m[1])].file;
  else file = path.join(speedscope, path.normalize(url === '/' ? '/index.html' : url));
  if (!m && !file.startsWith(speedscope)) { res.writeHead(403); res.end(); return; }
  fs.readFile(file, (e, d) => {
    if (e) { res.writeHead(404); res.end(); return; }
    res.writeHead(200, { 'Content-Type': types[path.extname(file)] || 'application/octet-stream' });
    res.end(d);
  });
});
const gpuNoise = (t) => /GL Driver Message|GPU stall|WebGL-/.test(t);
server.listen(0, '127.0.0.1', async () => {
  const base = `http://127.0.0.1:${server.address().port}`;
  const browser = await chromium.launch({ executablePath: executable, args: ['--no-sandbox'] });
  const out = [];
  try {
    for (const [i, p] of pages.entries()) {
      const page = await browser.newPage({ viewport: { width: 1600, height: 2400 } });
      const seen = { title: '', dialogs: [], errors: [], warnings: [], profiles: [], elements: 0 };
      page.on('dialog', d => { seen.dialogs.push(d.message()); d.dismiss().catch(() => {}); });
      page.on('pageerror', e => seen.errors.push(String(e)));
      page.on('console', m => {
        if ((m.type() === 'warning' || m.type() === 'error') && !gpuNoise(m.text())) seen.warnings.push(m.text());
      });
      const file = `${base}/page/${i}/${path.basename(p.file)}`;
      if (p.kind === 'speedscope') {
        await page.goto(`${base}/index.html#profileURL=${encodeURIComponent(file)}`);
        await page.waitForFunction(() => document.title.endsWith('- speedscope'), null, { timeout: 60000 })
          .catch(() => {});
        seen.title = await page.title();
        if (seen.title.endsWith('- speedscope') && seen.dialogs.length === 0) {
          await page.keyboard.press('3');
          const count = async () => {
            const t = await page.evaluate(() => document.body.innerText);
            const m = t.match(/\((\d+)\/(\d+)\)/);
            return m ? Number(m[2]) : 1;
          };
          const n = await count();
          for (let k = 0; k < n; k++) {
            await page.waitForTimeout(300);
            const t = await page.evaluate(() => document.body.innerText);
            const lines = t.split('\n').map(l => l.trim()).filter(l => l.length > 0);
            const name = (lines.find(l => /\(\d+\/\d+\)$/.test(l)) || lines[1] || '').replace(/\s*\(\d+\/\d+\)$/, '');
            const at = lines.findIndex(l => /Symbol Name$/.test(l));
            const rows = at < 0 ? [] : lines.slice(at + 1);
            const symbols = rows.filter((_, j) => j % 3 === 2);
            seen.profiles.push({ name, symbols });
            await page.keyboard.press('n');
          }
        }
      } else {
        await page.goto(file);
        await page.waitForLoadState('load');
        seen.title = await page.title();
        seen.elements = await page.evaluate(() => document.getElementsByTagName('*').length);
        if (p.screenshot) await page.screenshot({ path: p.screenshot, fullPage: true });
      }
      out.push(seen);
      await page.close();
    }
  } finally {
    await browser.close();
    server.close();
  }
  process.stdout.write(JSON.stringify(out));
});
"#;
