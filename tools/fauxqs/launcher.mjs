// Launcher for the fauxqs SQS/SNS emulator used by plugbus's tests.
//
// The fauxqs CLI listens on every interface; this launcher builds the same
// application through the package's exported buildApp and listens on the
// loopback interface only. Configuration, all optional:
//
//	FAUXQS_HOST_ADDR  address to bind (default 127.0.0.1; keep it on loopback)
//	FAUXQS_PORT       port (default 4566)
//	FAUXQS_REGION     region used when a request's signature names none (default us-east-1)
//	FAUXQS_LOGGER     "true" to log every request (default false)
import { buildApp } from "fauxqs";

const host = process.env.FAUXQS_HOST_ADDR || "127.0.0.1";
const port = Number.parseInt(process.env.FAUXQS_PORT || "4566", 10);
const defaultRegion = process.env.FAUXQS_REGION || "us-east-1";
const logger = process.env.FAUXQS_LOGGER === "true";

const app = buildApp({ logger, defaultRegion });

async function shutdown(signal) {
  console.log(`fauxqs: ${signal}, closing`);
  try {
    await app.close();
  } finally {
    process.exit(0);
  }
}
process.on("SIGINT", () => shutdown("SIGINT"));
process.on("SIGTERM", () => shutdown("SIGTERM"));

try {
  const address = await app.listen({ host, port });
  console.log(`fauxqs: listening on ${address} (region ${defaultRegion})`);
} catch (err) {
  console.error(`fauxqs: cannot listen on ${host}:${port}: ${err.message}`);
  process.exit(1);
}
