// npm_setup.mjs PREFIX -- the ctest fixture of server_openai: installs the
// official `openai` package (the pinned major) into PREFIX/node_modules.
// Always exits 0 so that the fixture never hides the reason: when npm
// fails (no registry, a timeout), PREFIX/npm_failed.txt says why and
// server_openai reports it (skipped, or failed under CI=true).
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

// openai 7 needs Node >= 22; 6 is the newest major for Node 20.
const OPENAI_MAJOR = 6;
const prefix = path.resolve(process.argv[2] || 'node');
const failed = path.join(prefix, 'npm_failed.txt');
const pkg = path.join(prefix, 'node_modules', 'openai', 'package.json');
const timeoutS = Number(process.env.RINGLM_NPM_TIMEOUT || 120);

function installed() {
  try {
    return Number(JSON.parse(fs.readFileSync(pkg, 'utf8')).version.split('.')[0]) === OPENAI_MAJOR;
  } catch {
    return false;
  }
}

fs.mkdirSync(prefix, { recursive: true });
if (installed()) {
  fs.rmSync(failed, { force: true });
  console.log(`openai@${JSON.parse(fs.readFileSync(pkg, 'utf8')).version} already in ${prefix}`);
  process.exit(0);
}
const args = ['install', '--prefix', prefix, '--no-save', '--no-audit', '--no-fund', '--no-package-lock',
  '--fetch-timeout=30000', '--fetch-retries=1', `openai@${OPENAI_MAJOR}`];
const npm = spawn('npm', args, { stdio: ['ignore', 'pipe', 'pipe'] });
let out = '';
npm.stdout.on('data', (d) => (out += d));
npm.stderr.on('data', (d) => (out += d));
const timer = setTimeout(() => {
  out += `\nnpm did not finish in ${timeoutS} s`;
  npm.kill('SIGKILL');
}, timeoutS * 1000);
npm.on('error', (e) => (out += `\ncannot run npm: ${e.message}`));
npm.on('close', (code, signal) => {
  clearTimeout(timer);
  if (code === 0 && installed()) {
    fs.rmSync(failed, { force: true });
    console.log(out.trim());
    console.log(`installed openai@${JSON.parse(fs.readFileSync(pkg, 'utf8')).version} into ${prefix}`);
  } else {
    // One line: npm's error code and message, else its last lines.
    const lines = out.trim().split('\n').map((l) => l.replace(/^npm (error|ERR!) /, '').trim()).filter(Boolean);
    const key = lines.filter((l) => /^(code|errno) |request to|network|timed out|did not finish|cannot run/i.test(l)).slice(0, 3);
    const why = `npm install openai@${OPENAI_MAJOR} into ${prefix} failed (${code ?? signal}): ${(key.length ? key : lines.slice(-3)).join('; ')}`;
    fs.writeFileSync(failed, why + '\n');
    console.log(why);
    console.log('server_openai will report this');
  }
  process.exit(0);
});
