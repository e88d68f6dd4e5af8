"""The synthetic target every hook is measured on (importable by module name, as hooks need)."""


class Target:
    def step(self, x):
        return x

    def tick(self, x):
        return x


def work(x):
    return x


async def awork(x):
    return x


async def agen(n):
    for i in range(n):
        yield i
