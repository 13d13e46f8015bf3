"""python manage.py tool_servers add NAME URL --tenant T [--credential ENV_NAME] [--timeout S] [--if-absent]
| list [--tenant T] | remove NAME --tenant T | check NAME --tenant T

A tenant's downstream MCP servers (agents_app.models.ToolServer), from the shell; every change is in the audit trail
under cli:<your OS login>. `check` connects, negotiates the protocol era, lists the tools and keeps the list.
`add --if-absent` leaves a server the tenant already has by that name as it is (the dev run registers the example
tool server so, at every start)."""

import getpass

from django.core.management.base import BaseCommand, CommandError

from agents_app import services
from agents_app.gateway.errors import ToolError
from agents_app.models import ToolServer


class Command(BaseCommand):
    help = "Add, list, remove or check a tenant's downstream MCP tool servers."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        add = sub.add_parser("add", help="add a server")
        add.add_argument("name")
        add.add_argument("url", help="its Streamable HTTP endpoint, e.g. http://127.0.0.1:8765/mcp")
        add.add_argument("--tenant", required=True)
        add.add_argument("--credential", default="", metavar="ENV_NAME",
                         help="the NAME of the environment variable holding its bearer token (never the token)")
        add.add_argument("--timeout", type=float, default=None, metavar="SECONDS")
        add.add_argument("--if-absent", action="store_true",
                         help="only if the tenant has no server of that name (one it has is kept as it is)")
        listing = sub.add_parser("list", help="list servers")
        listing.add_argument("--tenant")
        for action in ("remove", "check"):
            one = sub.add_parser(action, help=f"{action} a server")
            one.add_argument("name")
            one.add_argument("--tenant", required=True)

    def handle(self, *args, action, **options):
        actor = f"cli:{getpass.getuser()}"
        try:
            if action == "add" and options["if_absent"]:
                server, added = services.tool_server_ensure(tenant_slug=options["tenant"], name=options["name"],
                                                            url=options["url"], credential=options["credential"],
                                                            actor=actor, timeout_seconds=options["timeout"])
                self.stdout.write(f"added {server.name} ({server.url}) to tenant {server.tenant}" if added else
                                  f"tenant {server.tenant} has a tool server {server.name} already ({server.url}): "
                                  f"kept")
            elif action == "add":
                server = services.tool_server_add(tenant_slug=options["tenant"], name=options["name"],
                                                  url=options["url"], credential=options["credential"], actor=actor,
                                                  timeout_seconds=options["timeout"])
                self.stdout.write(f"added {server.name} ({server.url}) to tenant {server.tenant}; check it with: "
                                  f"tool_servers check {server.name} --tenant {server.tenant}")
            elif action == "list":
                servers = ToolServer.objects.select_related("tenant").order_by("tenant__slug", "name")
                if options["tenant"]:
                    servers = servers.filter(tenant__slug=options["tenant"])
                for server in servers:
                    tools = len(server.tools or [])
                    self.stdout.write(f"{server.tenant.slug:16} {server.name:20} {server.url}  "
                                      f"credential={server.credential or '-'}  "
                                      f"{server.protocol_version or 'not checked'}  {tools} tools")
            else:
                server = self._server(options["name"], options["tenant"])
                if action == "remove":
                    services.tool_server_remove(server=server, actor=actor)
                    self.stdout.write(f"removed {server.name} from tenant {options['tenant']}")
                else:
                    tools = services.tool_server_check(server=server)
                    self.stdout.write(f"{server.name}: {server.url} answers, protocol {server.protocol_version}, "
                                      f"{len(tools.by_name)} tools (version {server.tools_version[:12]})")
                    for spec in tools.by_name.values():
                        hints = ", ".join(hint for hint in ("readOnlyHint", "idempotentHint", "destructiveHint")
                                          if (spec.get("annotations") or {}).get(hint))
                        self.stdout.write(f"  {spec['name']:24} {hints or '-'}")
        except (services.ToolServerError, ToolError) as error:
            raise CommandError(str(error)) from None

    @staticmethod
    def _server(name: str, tenant: str) -> ToolServer:
        server = ToolServer.objects.filter(tenant__slug=tenant, name=name).first()
        if server is None:
            raise CommandError(f"no tool server {name!r} in tenant {tenant!r} (tool_servers list)")
        return server
